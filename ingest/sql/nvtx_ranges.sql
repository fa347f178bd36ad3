-- The stored columns of nvtx_ranges (the others are looked up or computed by the view): read nvtx_ranges.
CREATE TABLE _nvtx_range_rows (
  -- As nvtx_ranges.range_id.
  range_id BIGINT,
  -- As nvtx_ranges.start_ns.
  start_ns BIGINT,
  -- As nvtx_ranges.end_ns.
  end_ns BIGINT,
  -- As nvtx_ranges.text.
  text VARCHAR,
  -- As nvtx_ranges.domain_id.
  domain_id BIGINT,
  -- As nvtx_ranges.category_id.
  category_id BIGINT,
  -- As nvtx_ranges.color.
  color BIGINT,
  -- As nvtx_ranges.global_tid.
  global_tid BIGINT,
  -- As nvtx_ranges.end_global_tid.
  end_global_tid BIGINT,
  -- As nvtx_ranges.int64_value.
  int64_value BIGINT,
  -- As nvtx_ranges.uint64_value.
  uint64_value UBIGINT,
  -- As nvtx_ranges.int32_value.
  int32_value INTEGER,
  -- As nvtx_ranges.uint32_value.
  uint32_value UINTEGER,
  -- As nvtx_ranges.double_value.
  double_value DOUBLE,
  -- As nvtx_ranges.float_value.
  float_value FLOAT,
  -- As nvtx_ranges.json_text.
  json_text VARCHAR,
  -- As nvtx_ranges.parent_range_id.
  parent_range_id BIGINT,
  -- As nvtx_ranges.depth.
  depth INTEGER,
  -- Position of the raw row it came from in the export's NVTX_EVENTS, by which nsys.NVTX_EVENTS
  -- reads its values back from here; NULL for rows from other sources.
  export_row BIGINT
);

-- NVTX ranges: one row per push/pop range (eventType 59) or start/end range (60; 70 and 71 are
-- their NVTXT-imported twins), with text, domain, category, thread and payload resolved, and the
-- range's place in the push/pop nesting of its thread. From a PyTorch profiler trace: its
-- record_function ranges as push/pop ranges, and its Python stack frames (with_stack=True), nested
-- together with them on their thread.
-- Nesting: a push/pop range's parent is the innermost push/pop range on the same thread that
-- encloses it, and its depth is how many enclose it. Ranges that only touch (one ends at the
-- instant the next starts) are siblings. Start/end ranges take no part: they may overlap one another
-- and end on another thread, so they have no parent and no depth, and are no one's parent.
-- Stored are the values only a range has (_nvtx_range_rows); its length, kind, process, pid, tid
-- and the names of its thread, domain and category are computed or looked up here, which writes about
-- a third fewer values per range.
CREATE VIEW nvtx_ranges (
  -- Id of the range in this database: its position when ranges are ordered by start_ns, then global_tid, then longest first; the same export always gives the same ids.
  range_id,
  -- 'push_pop' (nvtxRangePush/Pop, or a PyTorch profiler record_function range: nests on its thread), 'start_end' (nvtxRangeStart/End: may overlap others and end on another thread), or 'python_frame' (a Python stack frame of a PyTorch profiler trace, text 'path(line): function': nests on its thread with the push/pop ranges).
  range_kind,
  -- Start, in ns since the capture session started (capture_meta.session_start_utc_ns).
  start_ns,
  -- End, in ns since the session started; NULL for a range still open when the capture stopped.
  end_ns,
  -- end_ns - start_ns; NULL when end_ns is NULL.
  dur_ns,
  -- The range's message: the text given inline, else the registered string it names (StringIds via textId).
  text,
  -- NVTX domain id within the process; 0 is the default domain; -1 for Python frames, which have none.
  domain_id,
  -- Domain name (nvtx_domains); NULL for the default domain, for Python frames, or where the domain's creation was not captured.
  domain_name,
  -- NVTX category id; NULL when the range has none.
  category_id,
  -- Category name registered for this process, domain and category id (nvtx_categories); NULL when unnamed.
  category_name,
  -- ARGB colour the range asked for, if any.
  color,
  -- Global id of the thread that started the range (threads.global_tid).
  global_tid,
  -- Global id of that thread's process (processes.global_pid).
  global_pid,
  -- Operating-system process id.
  pid,
  -- Operating-system thread id of the thread that started the range.
  tid,
  -- Name of the thread that started the range (threads.name).
  thread_name,
  -- Global id of the thread that ended a start/end range, where nsys recorded one (it does when that is not the starting thread).
  end_global_tid,
  -- Signed 64-bit payload; NULL when the range carries none of this type. Each payload column below likewise.
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
  -- JSON payload text, where the range carried one.
  json_text,
  -- The innermost push/pop range or Python frame on the same thread that encloses this one; NULL at top level and for start/end ranges.
  parent_range_id,
  -- Number of push/pop ranges and Python frames on the same thread that enclose this one, 0 at top level; NULL for start/end ranges.
  depth
) AS
SELECT
  r.range_id,
  CASE WHEN r.domain_id = -1 THEN 'python_frame' WHEN r.depth IS NULL THEN 'start_end' ELSE 'push_pop' END,
  r.start_ns,
  r.end_ns,
  r.end_ns - r.start_ns,
  r.text,
  r.domain_id,
  d.name,
  r.category_id,
  c.name,
  r.color,
  r.global_tid,
  t.global_pid,
  t.pid,
  t.tid,
  t.name,
  r.end_global_tid,
  r.int64_value,
  r.uint64_value,
  r.int32_value,
  r.uint32_value,
  r.double_value,
  r.float_value,
  r.json_text,
  r.parent_range_id,
  r.depth
FROM _nvtx_range_rows AS r
LEFT JOIN threads AS t ON t.global_tid = r.global_tid
LEFT JOIN nvtx_domains AS d ON d.global_pid = t.global_pid AND d.domain_id = r.domain_id
LEFT JOIN nvtx_categories AS c
  ON c.global_pid = t.global_pid AND c.domain_id = r.domain_id AND c.category_id = r.category_id;

-- In the export's row order, which for nsys's exports (sorted by start) is close to range_id order:
-- sorting a table this wide would cost more than building it.
INSERT INTO _nvtx_range_rows
SELECT
  n.range_id,
  e.start,
  e."end",
  e.text,
  e.domain_id,
  e.category_id,
  e.color,
  e.global_tid,
  e.end_global_tid,
  e.int64_value,
  e.uint64_value,
  e.int32_value,
  e.uint32_value,
  e.double_value,
  e.float_value,
  e.json_text,
  n.parent_range_id,
  n.depth,
  e._row
FROM _nvtx_events AS e
-- Every range's range_id, and the depth and parent of every push/pop range: ingest/nesting.py.
JOIN _nvtx_range_nesting AS n ON n._row = e._row;
