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

-- Every NVTX event with its text and payloads resolved (the views nvtx_ranges and nvtx_marks look up
-- the names of its thread, domain and category); dropped when the ingest ends.
CREATE TEMP VIEW _nvtx_events AS
SELECT
  e._row,
  e.eventType AS event_type,
  e.start,
  e."end",
  coalesce(e.text, s.value) AS text,
  coalesce(e.domainId, 0) AS domain_id,
  e.category AS category_id,
  e.color,
  e.globalTid AS global_tid,
  e.endGlobalTid AS end_global_tid,
  e.int64Value AS int64_value,
  -- Stored as signed 64-bit, like nsys's SQLite export; turned back into the unsigned value.
  CASE WHEN e.uint64Value < 0 THEN (e.uint64Value::HUGEINT + 18446744073709551616)::UBIGINT
       ELSE e.uint64Value::UBIGINT END AS uint64_value,
  e.int32Value::INTEGER AS int32_value,
  e.uint32Value::UINTEGER AS uint32_value,
  e.doubleValue AS double_value,
  e.floatValue::FLOAT AS float_value,
  coalesce(e.jsonText, j.value) AS json_text
FROM _raw_nvtx AS e
LEFT JOIN _raw_strings AS s ON s.id = e.textId
LEFT JOIN _raw_strings AS j ON j.id = e.jsonTextId;
