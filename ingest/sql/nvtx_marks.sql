-- NVTX marks: one row per instantaneous marker (nvtxMark, eventType 34), resolved like nvtx_ranges.
CREATE TABLE nvtx_marks (
  -- Id of the mark in this database: its position by ts_ns, then global_tid; stable across re-ingests.
  mark_id BIGINT,
  -- When the mark was made, in ns since the capture session started.
  ts_ns BIGINT,
  -- The mark's message: inline text, else the registered string it names (StringIds via textId).
  text VARCHAR,
  -- NVTX domain id within the process; 0 is the default domain.
  domain_id BIGINT,
  -- Domain name (nvtx_domains); NULL for the default domain.
  domain_name VARCHAR,
  -- NVTX category id; NULL when the mark has none.
  category_id BIGINT,
  -- Category name (nvtx_categories); NULL when unnamed.
  category_name VARCHAR,
  -- ARGB colour the mark asked for, if any.
  color BIGINT,
  -- Global id of the thread that made the mark (threads.global_tid).
  global_tid BIGINT,
  -- Global id of that thread's process (processes.global_pid).
  global_pid BIGINT,
  -- Operating-system process id.
  pid BIGINT,
  -- Operating-system thread id.
  tid BIGINT,
  -- Name of the thread that made the mark.
  thread_name VARCHAR,
  -- Signed 64-bit payload; NULL when the mark carries none of this type. Each payload column below likewise.
  int64_value BIGINT,
  -- Unsigned 64-bit payload.
  uint64_value UBIGINT,
  -- Signed 32-bit payload.
  int32_value INTEGER,
  -- Unsigned 32-bit payload.
  uint32_value UINTEGER,
  -- Double-precision payload.
  double_value DOUBLE,
  -- Single-precision payload.
  float_value FLOAT,
  -- JSON payload text, where the mark carried one.
  json_text VARCHAR
);

-- Every mark with its mark_id; also read by nsys_store.
CREATE OR REPLACE TEMP TABLE _nvtx_mark_numbered AS
SELECT _row, row_number() OVER (ORDER BY start, globalTid, _row) AS mark_id
FROM _raw_nvtx
WHERE eventType = 34;

INSERT INTO nvtx_marks
SELECT
  n.mark_id,
  e.start,
  e.text,
  e.domain_id,
  e.domain_name,
  e.category_id,
  e.category_name,
  e.color,
  e.global_tid,
  e.global_pid,
  e.pid,
  e.tid,
  e.thread_name,
  e.int64_value,
  e.uint64_value,
  e.int32_value,
  e.uint32_value,
  e.double_value,
  e.float_value,
  e.json_text
FROM _nvtx_mark_numbered AS n
JOIN _nvtx_events AS e ON e._row = n._row
WHERE e.event_type = 34  -- before the lookups of text, domain, category and thread, not after
ORDER BY n.mark_id;
