-- The stored columns of nvtx_marks (the others are looked up by the view): read nvtx_marks.
CREATE TABLE _nvtx_mark_rows (
  -- As nvtx_marks.mark_id.
  mark_id BIGINT,
  -- As nvtx_marks.ts_ns.
  ts_ns BIGINT,
  -- As nvtx_marks.text.
  text VARCHAR,
  -- As nvtx_marks.domain_id.
  domain_id BIGINT,
  -- As nvtx_marks.category_id.
  category_id BIGINT,
  -- As nvtx_marks.color.
  color BIGINT,
  -- As nvtx_marks.global_tid.
  global_tid BIGINT,
  -- As nvtx_marks.int64_value.
  int64_value BIGINT,
  -- As nvtx_marks.uint64_value.
  uint64_value UBIGINT,
  -- As nvtx_marks.int32_value.
  int32_value INTEGER,
  -- As nvtx_marks.uint32_value.
  uint32_value UINTEGER,
  -- As nvtx_marks.double_value.
  double_value DOUBLE,
  -- As nvtx_marks.float_value.
  float_value FLOAT,
  -- As nvtx_marks.json_text.
  json_text VARCHAR,
  -- Position of the raw row it came from in the export's NVTX_EVENTS, by which nsys.NVTX_EVENTS
  -- reads its values back from here; NULL for rows from other sources.
  export_row BIGINT
);

-- NVTX marks: one row per instantaneous marker (nvtxMark, eventType 34), resolved like nvtx_ranges.
-- Stored are the values only a mark has (_nvtx_mark_rows); the rest is looked up, as for nvtx_ranges.
CREATE VIEW nvtx_marks (
  -- Id of the mark in this database: its position by ts_ns, then global_tid; stable across re-ingests.
  mark_id,
  -- When the mark was made, in ns since the capture session started.
  ts_ns,
  -- The mark's message: inline text, else the registered string it names (StringIds via textId).
  text,
  -- NVTX domain id within the process; 0 is the default domain.
  domain_id,
  -- Domain name (nvtx_domains); NULL for the default domain.
  domain_name,
  -- NVTX category id; NULL when the mark has none.
  category_id,
  -- Category name (nvtx_categories); NULL when unnamed.
  category_name,
  -- ARGB colour the mark asked for, if any.
  color,
  -- Global id of the thread that made the mark (threads.global_tid).
  global_tid,
  -- Global id of that thread's process (processes.global_pid).
  global_pid,
  -- Operating-system process id.
  pid,
  -- Operating-system thread id.
  tid,
  -- Name of the thread that made the mark.
  thread_name,
  -- Signed 64-bit payload; NULL when the mark carries none of this type. Each payload column below likewise.
  int64_value,
  -- Unsigned 64-bit payload.
  uint64_value,
  -- Signed 32-bit payload.
  int32_value,
  -- Unsigned 32-bit payload.
  uint32_value,
  -- Double-precision payload.
  double_value,
  -- Single-precision payload.
  float_value,
  -- JSON payload text, where the mark carried one.
  json_text
) AS
SELECT
  m.mark_id,
  m.ts_ns,
  m.text,
  m.domain_id,
  d.name,
  m.category_id,
  c.name,
  m.color,
  m.global_tid,
  t.global_pid,
  t.pid,
  t.tid,
  t.name,
  m.int64_value,
  m.uint64_value,
  m.int32_value,
  m.uint32_value,
  m.double_value,
  m.float_value,
  m.json_text
FROM _nvtx_mark_rows AS m
LEFT JOIN threads AS t ON t.global_tid = m.global_tid
LEFT JOIN nvtx_domains AS d ON d.global_pid = t.global_pid AND d.domain_id = m.domain_id
LEFT JOIN nvtx_categories AS c
  ON c.global_pid = t.global_pid AND c.domain_id = m.domain_id AND c.category_id = m.category_id;

-- Every mark with its mark_id.
CREATE OR REPLACE TEMP TABLE _nvtx_mark_numbered AS
SELECT _row, row_number() OVER (ORDER BY start, globalTid, _row) AS mark_id
FROM _raw_nvtx
WHERE eventType = 34;

INSERT INTO _nvtx_mark_rows
SELECT
  n.mark_id,
  e.start,
  e.text,
  e.domain_id,
  e.category_id,
  e.color,
  e.global_tid,
  e.int64_value,
  e.uint64_value,
  e.int32_value,
  e.uint32_value,
  e.double_value,
  e.float_value,
  e.json_text,
  n._row
FROM _nvtx_mark_numbered AS n
JOIN _nvtx_events AS e ON e._row = n._row
WHERE e.event_type = 34
ORDER BY n.mark_id;
