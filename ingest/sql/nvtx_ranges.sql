-- NVTX ranges: one row per push/pop range (eventType 59) or start/end range (60; 70 and 71 are
-- their NVTXT-imported twins), with text, domain, category, thread and payload resolved, and the
-- range's place in the push/pop nesting of its thread.
-- Nesting: a push/pop range's parent is the innermost push/pop range on the same thread that
-- encloses it, and its depth is how many enclose it. Ranges that only touch (one ends at the
-- instant the next starts) are siblings. Start/end ranges take no part: they may overlap one another
-- and end on another thread, so they have no parent and no depth, and are no one's parent.
CREATE TABLE nvtx_ranges (
  -- Id of the range in this database: its position when ranges are ordered by start_ns, then global_tid, then longest first; the same export always gives the same ids.
  range_id BIGINT,
  -- 'push_pop' (nvtxRangePush/Pop: nests on its thread) or 'start_end' (nvtxRangeStart/End: may overlap others and end on another thread).
  range_kind VARCHAR,
  -- Start, in ns since the capture session started (capture_meta.session_start_utc_ns).
  start_ns BIGINT,
  -- End, in ns since the session started; NULL for a range still open when the capture stopped.
  end_ns BIGINT,
  -- end_ns - start_ns; NULL when end_ns is NULL.
  dur_ns BIGINT,
  -- The range's message: the text given inline, else the registered string it names (StringIds via textId).
  text VARCHAR,
  -- NVTX domain id within the process; 0 is the default domain.
  domain_id BIGINT,
  -- Domain name (nvtx_domains); NULL for the default domain or where the domain's creation was not captured.
  domain_name VARCHAR,
  -- NVTX category id; NULL when the range has none.
  category_id BIGINT,
  -- Category name registered for this process, domain and category id (nvtx_categories); NULL when unnamed.
  category_name VARCHAR,
  -- ARGB colour the range asked for, if any.
  color BIGINT,
  -- Global id of the thread that started the range (threads.global_tid).
  global_tid BIGINT,
  -- Global id of that thread's process (processes.global_pid).
  global_pid BIGINT,
  -- Operating-system process id.
  pid BIGINT,
  -- Operating-system thread id of the thread that started the range.
  tid BIGINT,
  -- Name of the thread that started the range (threads.name).
  thread_name VARCHAR,
  -- Global id of the thread that ended a start/end range, where nsys recorded one (it does when that is not the starting thread).
  end_global_tid BIGINT,
  -- Signed 64-bit payload; NULL when the range carries none of this type. Each payload column below likewise.
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
  -- JSON payload text, where the range carried one.
  json_text VARCHAR,
  -- The innermost push/pop range on the same thread that encloses this one; NULL at top level and for start/end ranges.
  parent_range_id BIGINT,
  -- Number of push/pop ranges on the same thread that enclose this one, 0 at top level; NULL for start/end ranges.
  depth INTEGER
);

-- Every range with its range_id and the columns the nesting needs (ingest/nesting.py); also read
-- by nsys_store, which keeps the raw columns nvtx_ranges does not hold beside the range_id.
CREATE OR REPLACE TEMP TABLE _nvtx_range_numbered AS
WITH
  trace_end AS (
    -- The last NVTX timestamp: a range still open when the capture stopped is taken to end here.
    SELECT coalesce(max(greatest(start, coalesce("end", start))), 0) AS ts
    FROM _raw_nvtx
  ),
  ranges AS (
    SELECT
      _row,
      globalTid AS global_tid,
      start AS start_ns,
      greatest(coalesce("end", (SELECT ts FROM trace_end)), start) AS end_eff,
      eventType IN (59, 70) AS is_push_pop
    FROM _raw_nvtx
    WHERE eventType IN (59, 60, 70, 71)
  )
SELECT *, row_number() OVER (ORDER BY start_ns, global_tid, end_eff DESC, _row) AS range_id
FROM ranges;

-- In the export's row order, which for nsys's exports (sorted by start) is close to range_id order:
-- sorting a table this wide would cost more than building it.
INSERT INTO nvtx_ranges
SELECT
  n.range_id,
  CASE WHEN n.is_push_pop THEN 'push_pop' ELSE 'start_end' END,
  e.start,
  e."end",
  e."end" - e.start,
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
  e.end_global_tid,
  e.int64_value,
  e.uint64_value,
  e.int32_value,
  e.uint32_value,
  e.double_value,
  e.float_value,
  e.json_text,
  n.parent_range_id,
  n.depth
FROM _nvtx_events AS e
JOIN (
  -- Depth and parent of every push/pop range, computed by ingest/nesting.py from _nvtx_range_numbered.
  SELECT _row, range_id, TRUE AS is_push_pop, depth, parent_range_id FROM _nvtx_push_pop_nesting
  UNION ALL
  SELECT _row, range_id, FALSE, NULL, NULL FROM _nvtx_range_numbered WHERE NOT is_push_pop
) AS n ON n._row = e._row;
