-- NVTX domain names: the name each nvtxDomainCreate (eventType 75) gave a domain id within a process.
-- The default domain (id 0) has no row.
CREATE TABLE nvtx_domains (
  -- Process the domain belongs to (domain ids are numbered per process).
  global_pid BIGINT,
  -- Domain id within the process.
  domain_id BIGINT,
  -- Domain name as the program registered it.
  name VARCHAR
);

INSERT INTO nvtx_domains
SELECT
  (e.globalTid >> 24) << 24 AS global_pid,
  e.domainId AS domain_id,
  arg_min(coalesce(e.text, s.value), (e.start, e._row)) AS name
FROM _raw_nvtx AS e
LEFT JOIN _raw_strings AS s ON s.id = e.textId
WHERE e.eventType = 75 AND e.domainId IS NOT NULL
GROUP BY ALL
ORDER BY ALL;

-- NVTX category names: the name each nvtxDomainNameCategory (eventType 33) gave a category id
-- within a domain of a process.
CREATE TABLE nvtx_categories (
  -- Process the category belongs to.
  global_pid BIGINT,
  -- Domain the category belongs to; 0 is the default domain.
  domain_id BIGINT,
  -- Category id, as ranges and marks carry it (nvtx_ranges.category_id).
  category_id BIGINT,
  -- Category name as the program registered it.
  name VARCHAR
);

INSERT INTO nvtx_categories
SELECT
  (e.globalTid >> 24) << 24 AS global_pid,
  coalesce(e.domainId, 0) AS domain_id,
  e.category AS category_id,
  arg_min(coalesce(e.text, s.value), (e.start, e._row)) AS name
FROM _raw_nvtx AS e
LEFT JOIN _raw_strings AS s ON s.id = e.textId
WHERE e.eventType = 33 AND e.category IS NOT NULL
GROUP BY ALL
ORDER BY ALL;
