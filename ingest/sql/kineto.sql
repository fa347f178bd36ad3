-- PyTorch profiler (Kineto) traces into the normalized tables (created from their own files) and into
-- tables of their own, from the staged events of every trace file (kineto_stage.sql).
--
-- Ids. A trace file is a source (kineto_sources.source_no, 1, 2, ... in the order given). Threads and
-- processes get nsys's layout of global ids with the source in the top 16 bits:
-- global_tid = source_no << 48 | pid << 24 | tid (pid and tid of 24 bits, as on Linux), so ranks
-- never share a thread or a process. GPU work belongs to the process whose runtime call launched it
-- (the same correlation id in the same file).

-- One row per trace file.
CREATE TABLE kineto_sources (
  -- The file's number in this database, 1, 2, ... in the order given to the ingest: bits 48 and up of every global_pid and global_tid from it.
  source_no INTEGER,
  -- The trace file, as an absolute path.
  source VARCHAR,
  -- Distributed rank of the traced process (distributedInfo.rank); NULL when the trace does not say.
  rank BIGINT,
  -- Number of ranks of the job (distributedInfo.world_size).
  world_size BIGINT,
  -- Collective backend, e.g. 'nccl' or 'gloo' (distributedInfo.backend).
  backend VARCHAR,
  -- The profiler's trace schema version (schemaVersion).
  schema_version VARCHAR,
  -- The unit the trace asks viewers to show ('ns' or 'ms'); ts and dur are microseconds either way.
  display_time_unit VARCHAR,
  -- baseTimeNanoseconds: the Unix time in ns that the file's timestamps count from; NULL in older traces, whose timestamps are Unix time in microseconds.
  base_time_ns BIGINT,
  -- What was added to this file's times so that every source counts from one instant (capture_meta.session_start_utc_ns); 0 for a single file.
  time_shift_ns BIGINT,
  -- NVTX domain given to the file's annotation ranges and marks that name none (its top-level itertrace.domain, as `itertrace run --torch-profile` writes it); NULL for the default domain.
  range_domain VARCHAR,
  -- Names of the annotation ranges that stand for NVTX marks (its top-level itertrace.marks; a range named NAME or 'NAME ...'): they are in nvtx_marks, not nvtx_ranges.
  mark_names VARCHAR[],
  -- Events in the file's traceEvents array.
  events BIGINT,
  -- Events per category (cat), as JSON, e.g. {"kernel": 4350, "cuda_runtime": 15329}.
  events_by_cat JSON,
  -- distributedInfo as JSON.
  distributed_info JSON,
  -- Every other top-level key (deviceProperties aside) as one JSON object: trace name, host, job labels, the profiler's log lines.
  metadata JSON
);

-- The GPUs of each trace (deviceProperties): one row per device.
CREATE TABLE kineto_devices (
  -- The trace file (kineto_sources.source_no).
  source_no INTEGER,
  -- Device id, as gpu_ops.device_id holds it.
  device_id BIGINT,
  -- Device name, e.g. 'NVIDIA A100-PG509-200'.
  name VARCHAR,
  -- Device memory in bytes (totalGlobalMem).
  total_memory_bytes BIGINT,
  -- Compute capability, e.g. '8.0' (computeMajor.computeMinor).
  compute_capability VARCHAR,
  -- Streaming multiprocessors (numSms).
  sm_count BIGINT,
  -- Every property the trace gives, as JSON.
  properties JSON
);

-- Operators the profiler recorded on the host (cat cpu_op: aten::mm, autograd nodes, ...): one row per op.
CREATE TABLE kineto_cpu_ops (
  -- Id of the op in this database: its position by start_ns, then global_tid, then longest first.
  op_id BIGINT,
  -- Start, in ns (the same clock as nvtx_ranges).
  start_ns BIGINT,
  -- End, in ns.
  end_ns BIGINT,
  -- end_ns - start_ns.
  dur_ns BIGINT,
  -- Operator name, e.g. 'aten::addmm'.
  name VARCHAR,
  -- The thread that ran it (threads.global_tid).
  global_tid BIGINT,
  -- Its process (processes.global_pid).
  global_pid BIGINT,
  -- Operating-system process id.
  pid BIGINT,
  -- Operating-system thread id.
  tid BIGINT,
  -- The profiler's External id: the runtime calls the op made carry the same one.
  external_id BIGINT,
  -- The innermost range on its thread that encloses the op, a record_function range or a Python frame (nvtx_ranges.range_id); NULL when none does.
  parent_range_id BIGINT,
  -- The event's args as the trace gives them (Input Dims, Input type, Sequence number, ...), as JSON.
  args JSON
);

-- Annotation ranges as the profiler projected them onto GPU streams (cat gpu_user_annotation): one row per range.
CREATE TABLE kineto_gpu_annotations (
  -- Start on the GPU, in ns.
  start_ns BIGINT,
  -- End on the GPU, in ns.
  end_ns BIGINT,
  -- end_ns - start_ns.
  dur_ns BIGINT,
  -- The range's name (the host range's, nvtx_ranges.text).
  name VARCHAR,
  -- The trace file (kineto_sources.source_no).
  source_no INTEGER,
  -- Device id.
  device_id BIGINT,
  -- Stream id.
  stream_id BIGINT,
  -- The profiler's External id, shared with the host range it projects.
  external_id BIGINT
);

-- Every CPU thread of every trace that holds events read here (annotations, marks, ops, API calls; not
-- the tracks of categories itertrace_*, which `itertrace export perfetto` adds), with its global ids.
CREATE TEMP TABLE _kineto_threads AS
WITH
  gpu_pids AS (
    SELECT DISTINCT source_no, pid FROM _kineto_events
    WHERE cat IN ('kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset', 'gpu_user_annotation', 'cuda_sync')
  ),
  seen AS (
    SELECT DISTINCT source_no, pid, tid FROM _kineto_events AS e
    WHERE pid IS NOT NULL AND tid IS NOT NULL
      AND ((ph = 'X' AND cat IN ('user_annotation', 'python_function', 'cpu_op', 'operator', 'cuda_runtime', 'runtime',
                                 'cuda_driver', 'driver'))
           OR (ph IN ('i', 'I') AND coalesce(cat, '') NOT LIKE 'itertrace%'))
      AND NOT EXISTS (SELECT 1 FROM gpu_pids AS g WHERE g.source_no = e.source_no AND g.pid = e.pid)
  ),
  named AS (
    SELECT source_no, pid, tid, arg_max(arg_name, rowid) AS name
    FROM _kineto_events
    WHERE ph = 'M' AND name = 'thread_name' AND pid IS NOT NULL AND tid IS NOT NULL
    GROUP BY ALL
  )
SELECT
  s.source_no,
  s.pid,
  s.tid,
  (s.source_no::BIGINT << 48) | ((s.pid & 16777215) << 24) AS global_pid,
  (s.source_no::BIGINT << 48) | ((s.pid & 16777215) << 24) | (s.tid & 16777215) AS global_tid,
  n.name
FROM seen AS s
LEFT JOIN named AS n USING (source_no, pid, tid);

INSERT INTO threads
SELECT global_tid, global_pid, pid, tid, name FROM _kineto_threads ORDER BY global_tid;

INSERT INTO processes
WITH
  named AS (
    SELECT source_no, pid, arg_max(arg_name, rowid) AS name
    FROM _kineto_events
    WHERE ph = 'M' AND name = 'process_name' AND pid IS NOT NULL
    GROUP BY ALL
  )
SELECT t.global_pid, t.pid, any_value(n.name), count(*)
FROM _kineto_threads AS t
LEFT JOIN named AS n USING (source_no, pid)
GROUP BY t.global_pid, t.pid
ORDER BY t.global_pid;

-- Annotation ranges, Python stack frames (cat python_function, as with_stack=True records them) and
-- marks on CPU threads, with their domain: an annotation's own (args.domain, as `itertrace export
-- perfetto` writes it), else its file's (kineto_sources.range_domain); a frame has none.
CREATE TEMP TABLE _kineto_annotations AS
WITH
  events AS (
    SELECT
      e.rowid AS _row,
      e.cat IS NOT DISTINCT FROM 'python_function' AS is_frame,
      e.ph IN ('i', 'I') OR (e.cat = 'user_annotation' AND list_contains(s.mark_names, split_part(e.name, ' ', 1)))
        AS is_mark,
      t.global_tid,
      t.global_pid,
      e.ts_ns AS start_ns,
      e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns,
      e.name AS text,
      CASE WHEN e.cat IS DISTINCT FROM 'python_function' THEN coalesce(e.domain, s.range_domain) END AS domain_name,
      e.int64_value
    FROM _kineto_events AS e
    JOIN _kineto_threads AS t USING (source_no, pid, tid)
    JOIN kineto_sources AS s USING (source_no)
    WHERE (e.ph = 'X' AND e.cat IN ('user_annotation', 'python_function'))
       OR (e.ph IN ('i', 'I') AND coalesce(e.cat, '') NOT LIKE 'itertrace%')
  )
-- A range's id: its position by start_ns, then global_tid, then longest first (marks are numbered apart).
SELECT *, row_number() OVER (PARTITION BY is_mark ORDER BY start_ns, global_tid, end_ns DESC, _row) AS range_id
FROM events;

-- Domain ids, numbered 1, 2, ... by name within each process; 0 stays the default domain.
INSERT INTO nvtx_domains
SELECT global_pid, row_number() OVER (PARTITION BY global_pid ORDER BY domain_name), domain_name
FROM (SELECT DISTINCT global_pid, domain_name FROM _kineto_annotations WHERE domain_name IS NOT NULL)
ORDER BY ALL;

-- Here ingest/kineto_nesting.py makes _kineto_nesting (id, depth, parent_range_id): how the ranges
-- (annotations and frames together) nest on their threads, and the range that encloses each CPU op
-- (id -1 - the op's _kineto_events.rowid), from the rows of _kineto_nesting_input.
CREATE TEMP VIEW _kineto_nesting_input AS
SELECT CASE WHEN is_frame THEN 0 ELSE 1 END AS kind, range_id AS id, global_tid, start_ns, end_ns, range_id AS order_key
FROM _kineto_annotations
WHERE NOT is_mark AND start_ns IS NOT NULL
UNION ALL
SELECT 2, -e.rowid - 1, t.global_tid, e.ts_ns, e.ts_ns + coalesce(e.dur_ns, 0), e.rowid
FROM _kineto_events AS e
JOIN _kineto_threads AS t USING (source_no, pid, tid)
WHERE e.ph = 'X' AND e.cat IN ('cpu_op', 'operator') AND e.ts_ns IS NOT NULL;

INSERT INTO _nvtx_range_rows
SELECT
  r.range_id, r.start_ns, r.end_ns, r.text, CASE WHEN r.is_frame THEN -1 ELSE coalesce(d.domain_id, 0) END, NULL,
  NULL, r.global_tid, NULL, r.int64_value, NULL, NULL, NULL, NULL, NULL, NULL, n.parent_range_id, n.depth, NULL
FROM _kineto_annotations AS r
LEFT JOIN _kineto_nesting AS n ON n.id = r.range_id
LEFT JOIN nvtx_domains AS d ON d.global_pid = r.global_pid AND d.name = r.domain_name
WHERE NOT r.is_mark
ORDER BY r.range_id;

INSERT INTO _nvtx_mark_rows
SELECT
  row_number() OVER (ORDER BY m.start_ns, m.global_tid, m._row), m.start_ns, m.text,
  coalesce(d.domain_id, 0), NULL, NULL, m.global_tid, m.int64_value, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM _kineto_annotations AS m
LEFT JOIN nvtx_domains AS d ON d.global_pid = m.global_pid AND d.name = m.domain_name
WHERE m.is_mark
ORDER BY 1;

INSERT INTO _cuda_api_rows
SELECT
  row_number() OVER (ORDER BY e.ts_ns, t.global_tid, e.correlation_id, e.rowid),
  e.ts_ns, e.ts_ns + e.dur_ns, e.name,
  CASE WHEN e.cat IN ('cuda_driver', 'driver') THEN 1 ELSE 0 END,
  CASE WHEN e.cat IN ('cuda_driver', 'driver') THEN 'CUDA driver' ELSE 'CUDA runtime' END,
  t.global_tid, e.correlation_id, NULL, NULL
FROM _kineto_events AS e
JOIN _kineto_threads AS t USING (source_no, pid, tid)
WHERE e.ph = 'X' AND e.cat IN ('cuda_runtime', 'runtime', 'cuda_driver', 'driver')
ORDER BY 1;

INSERT INTO _gpu_op_rows
WITH
  launchers AS (
    -- The process of the runtime call of each correlation id, per file.
    SELECT t.source_no, e.correlation_id, min(t.global_pid) AS global_pid, min(e.pid) AS pid
    FROM _kineto_events AS e
    JOIN _kineto_threads AS t USING (source_no, pid, tid)
    WHERE e.ph = 'X' AND e.cat IN ('cuda_runtime', 'runtime', 'cuda_driver', 'driver') AND e.correlation_id IS NOT NULL
    GROUP BY ALL
  ),
  only_process AS (
    -- A file's process where it has only one: the launcher of GPU work no runtime call claims.
    SELECT source_no, min(global_pid) AS global_pid, min(pid) AS pid
    FROM _kineto_threads GROUP BY source_no HAVING count(DISTINCT global_pid) = 1
  ),
  ops AS (
    SELECT
      e.rowid AS _row,
      CASE WHEN e.cat = 'kernel' THEN 'kernel' WHEN e.cat LIKE '%memcpy' THEN 'memcpy' ELSE 'memset' END AS kind,
      e.ts_ns, e.dur_ns, e.name, coalesce(e.device_id, e.pid) AS device_id, e.context_id,
      coalesce(e.stream_id, e.tid) AS stream_id, e.correlation_id, e.bytes,
      coalesce(l.global_pid, o.global_pid) AS global_pid, coalesce(l.pid, o.pid) AS launch_pid
    FROM _kineto_events AS e
    LEFT JOIN launchers AS l USING (source_no, correlation_id)
    LEFT JOIN only_process AS o USING (source_no)
    WHERE e.ph = 'X' AND e.cat IN ('kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset')
  )
SELECT
  row_number() OVER (ORDER BY ts_ns, kind, device_id, stream_id, correlation_id, _row),
  kind, ts_ns, ts_ns + dur_ns, name, NULL, device_id, context_id, stream_id, correlation_id,
  global_pid, launch_pid, bytes,
  CASE WHEN kind = 'memcpy' THEN  -- Kineto names a copy e.g. 'Memcpy HtoD (Pageable -> Device)'
    CASE regexp_extract(name, '\b([HDP]to[HDP])\b', 1)
      WHEN 'HtoD' THEN 'Host-to-Device' WHEN 'DtoH' THEN 'Device-to-Host' WHEN 'DtoD' THEN 'Device-to-Device'
      WHEN 'HtoH' THEN 'Host-to-Host' WHEN 'PtoP' THEN 'Peer-to-Peer' END
  END,
  NULL,
  NULL
FROM ops
ORDER BY 1;

INSERT INTO nvtx_gpu_projection
WITH
  launches AS (
    -- Each runtime call that launched GPU work: the span and number of that work.
    SELECT a.global_tid, a.start_ns, a.end_ns, min(g.start_ns) AS gpu_start_ns, max(g.end_ns) AS gpu_end_ns,
           count(*) AS gpu_ops
    FROM cuda_api AS a
    JOIN gpu_ops AS g ON g.correlation_id = a.correlation_id AND g.global_pid = a.global_pid
    GROUP BY a.api_id, a.global_tid, a.start_ns, a.end_ns
  ),
  -- (thread, time) as one HUGEINT, so that "on the range's thread, inside the range" is a pair of
  -- inequalities: a sort-based IEJoin, not a comparison of every pair on a thread.
  range_keys AS (
    SELECT range_id, (global_tid::HUGEINT << 64) + start_ns AS lo, (global_tid::HUGEINT << 64) + end_ns AS hi
    FROM nvtx_ranges
  ),
  launch_keys AS (
    SELECT gpu_start_ns, gpu_end_ns, gpu_ops,
           (global_tid::HUGEINT << 64) + start_ns AS lo, (global_tid::HUGEINT << 64) + end_ns AS hi
    FROM launches
  )
SELECT r.range_id, min(l.gpu_start_ns), max(l.gpu_end_ns), max(l.gpu_end_ns) - min(l.gpu_start_ns),
       sum(l.gpu_ops), count(*)
FROM range_keys AS r
JOIN launch_keys AS l ON l.lo >= r.lo AND l.hi <= r.hi
GROUP BY r.range_id
ORDER BY r.range_id;

-- The ops are numbered in a sort of their keys alone, and their args (hundreds of bytes each) joined on
-- after: a sort that carried the args took a quarter longer (239,100 ops of a repeated sample).
INSERT INTO kineto_cpu_ops
WITH
  ops AS (
    SELECT e.rowid AS _row, t.global_tid, t.global_pid,
           row_number() OVER (ORDER BY e.ts_ns, t.global_tid, e.dur_ns DESC, e.rowid) AS op_id
    FROM _kineto_events AS e
    JOIN _kineto_threads AS t USING (source_no, pid, tid)
    WHERE e.ph = 'X' AND e.cat IN ('cpu_op', 'operator')
  )
SELECT
  o.op_id, e.ts_ns, e.ts_ns + e.dur_ns, e.dur_ns, e.name, o.global_tid, o.global_pid, e.pid, e.tid,
  coalesce(e.external_id, try_cast(e.args ->> '$."External id"' AS BIGINT)), n.parent_range_id, e.args
FROM ops AS o
JOIN _kineto_events AS e ON e.rowid = o._row
LEFT JOIN _kineto_nesting AS n ON n.id = -o._row - 1
ORDER BY o.op_id;

INSERT INTO kineto_gpu_annotations
SELECT ts_ns, ts_ns + dur_ns, dur_ns, name, source_no, coalesce(device_id, pid), coalesce(stream_id, tid), external_id
FROM _kineto_events
WHERE ph = 'X' AND cat = 'gpu_user_annotation'
ORDER BY ts_ns, source_no, rowid;

-- The profiler's own spans (capture_spans.sql): its Trace event, for every process of the file; and
-- the span of each process's ProfilerStep#N annotations.
INSERT INTO capture_spans
WITH
  traced AS (
    SELECT source_no, min(ts_ns) AS start_ns, max(ts_ns + coalesce(dur_ns, 0)) AS end_ns
    FROM _kineto_events
    WHERE ph = 'X' AND cat = 'trace'
    GROUP BY source_no
  ),
  stepped AS (
    SELECT global_pid, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM _kineto_annotations
    WHERE NOT is_mark AND NOT is_frame AND regexp_matches(text, '^ProfilerStep#\d+$')
    GROUP BY global_pid
  )
SELECT p.global_pid, s.start_ns, s.end_ns, 'kineto trace span'
FROM traced AS s
JOIN (SELECT DISTINCT source_no, global_pid FROM _kineto_threads) AS p USING (source_no)
UNION ALL
SELECT global_pid, start_ns, end_ns, 'kineto profiler steps' FROM stepped
ORDER BY 1, 4;

-- What became of the events, by category (coalesce(cat, ph)): the table or use they went to, or why
-- they were skipped; the ingest's closing line reports it.
CREATE TEMP TABLE _kineto_event_fates AS
WITH
  fates AS (
    SELECT
      coalesce(e.cat, e.ph) AS category,
      e.ph IN ('X', 'i', 'I') AND (e.pid IS NULL OR e.tid IS NULL) AND e.cat IN (
        'python_function', 'user_annotation', 'cpu_op', 'operator', 'cuda_runtime', 'runtime', 'cuda_driver', 'driver')
        OR e.ph IN ('i', 'I') AND (e.pid IS NULL OR e.tid IS NULL) AS off_thread,
      CASE
        WHEN off_thread THEN NULL
        WHEN e.ph = 'X' AND e.cat = 'python_function' THEN 'frames, in nvtx_ranges'
        WHEN e.ph = 'X' AND e.cat = 'user_annotation' THEN
          CASE WHEN list_contains(s.mark_names, split_part(e.name, ' ', 1)) THEN 'nvtx_marks' ELSE 'nvtx_ranges' END
        WHEN e.ph IN ('i', 'I') AND coalesce(e.cat, '') NOT LIKE 'itertrace%' THEN 'nvtx_marks'
        WHEN e.ph = 'X' AND e.cat IN ('cpu_op', 'operator') THEN 'kineto_cpu_ops'
        WHEN e.ph = 'X' AND e.cat IN ('cuda_runtime', 'runtime', 'cuda_driver', 'driver') THEN 'cuda_api'
        WHEN e.ph = 'X' AND e.cat IN ('kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset') THEN 'gpu_ops'
        WHEN e.ph = 'X' AND e.cat = 'gpu_user_annotation' THEN 'kineto_gpu_annotations'
        WHEN e.ph = 'X' AND e.cat = 'trace' THEN 'the profiler''s span, in capture_spans'
        WHEN e.ph IN ('s', 'f', 't') AND e.cat IN ('ac2g', 'async_cpu_to_gpu', 'async_gpu')
          THEN 'flows, read for correlation ids'
        WHEN e.ph = 'M' AND e.name IN ('thread_name', 'process_name') THEN 'names of threads and processes'
      END AS kept_in,
      CASE
        WHEN off_thread THEN 'on no thread: pid or tid not a number'
        WHEN e.ph = 'X' AND e.cat = 'cuda_sync' THEN 'synchronization waits, not GPU work'
        WHEN e.ph = 'M' THEN 'display settings'
        WHEN coalesce(e.cat, '') LIKE 'itertrace%' THEN 'tracks that itertrace export perfetto adds'
        WHEN e.ph IN ('s', 'f', 't') THEN 'flows between ops'
        ELSE 'not read'
      END AS skipped_why
    FROM _kineto_events AS e
    JOIN kineto_sources AS s USING (source_no)
  )
SELECT category, kept_in, CASE WHEN kept_in IS NULL THEN skipped_why END AS skipped_why, count(*) AS events
FROM fates
GROUP BY ALL
UNION ALL
SELECT category, NULL, skipped_why, events FROM _kineto_left_out;  -- kineto_checks.leave_out: with a note each
