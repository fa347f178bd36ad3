-- GPU time: per GPU and process, the capture window split exactly into busy and idle, and the idle time by kind.
--
-- Notes. Each GPU (device id, and process using it) has a window of its own: the span the profiler
-- recorded for that process, where the capture says (capture_spans: the PyTorch profiler's trace span,
-- else its ProfilerStep annotations), widened to hold all of its GPU work; else its GPU work's first
-- start to last end, as Holistic Trace Analysis takes it. Never the last stray host call: a call made
-- after the work and the profiler are done is no time of the GPU's. Nsight Systems' exports (2022.4)
-- do not say whether their collection was a capture range or the whole session from the
-- application's launch, so an nsys capture's window is its GPU work's span. `window_source` says
-- which. A GPU is busy where any of the process's kernels, memcpys or memsets runs on that device, on
-- any stream: the union of their intervals, so overlapping work counts once. The rest of the window
-- is idle, and is split by the process's iterations (their device intervals, from iterations.sql and
-- the mapping): idle `within` an iteration lies inside an iteration's device
-- interval, between its GPU work; `between` iterations lies after the device work of every
-- iteration so far and before the next iteration's device start; `outside` lies before the first
-- iteration or after the last, and is all idle time when the mapping finds no iteration. Each idle
-- span names the iteration it lies in or after: within, the iteration whose device interval started
-- last at or before it; between and after the last, the iteration whose device work ended last
-- before it; before the first, none. The parts always add up to the window, to the nanosecond.
--
-- gpu_idle_parts.sql splits every idle span by what the host was doing. All of it is computed with
-- sort-based joins: busy time and idle spans by running windows over each device's work in start
-- order, and the gaps cut by the segments by two ASOF joins (an interval of one set starting inside
-- one of the other, or the other way round), as host_gaps.sql does.
--
-- @uses iterations

-- The (device, process) pairs that ran GPU work.
CREATE VIEW gpu_time_gpus AS
SELECT DISTINCT device_id, global_pid FROM gpu_ops;

-- Per GPU, its window and where it comes from; querying it fails with a message when the capture holds
-- no GPU work.
CREATE VIEW _gpu_time_window AS
WITH
  work AS (SELECT device_id, global_pid, min(start_ns) AS first_ns, max(end_ns) AS last_ns FROM gpu_ops GROUP BY ALL),
  spans AS (
    -- the profiler's own span of each process: its trace span, else its profiler steps
    SELECT global_pid, arg_min({'start_ns': start_ns, 'end_ns': end_ns, 'source': source},
                               source <> 'kineto trace span') AS span
    FROM capture_spans
    WHERE source IN ('kineto trace span', 'kineto profiler steps')
    GROUP BY global_pid
  )
SELECT
  w.device_id,
  w.global_pid,
  CASE WHEN w.device_id IS NULL AND w.global_pid IS NULL
    THEN error('no GPU work in this capture (gpu_ops is empty: no kernel, memcpy or memset was recorded), so there '
               || 'is no GPU time to account; capture with CUDA tracing (nsys profile --trace=cuda,nvtx ...)')
    ELSE least(coalesce(s.span.start_ns, w.first_ns), w.first_ns) END AS start_ns,
  greatest(coalesce(s.span.end_ns, w.last_ns), w.last_ns) AS end_ns,
  coalesce(s.span.source, 'GPU work') AS source
FROM (SELECT 1) AS one
LEFT JOIN work AS w ON true
LEFT JOIN spans AS s ON s.global_pid = w.global_pid;

-- GPU operations of positive length in start order on their device, each with the latest end
-- among the operations before it (NULL for the first).
CREATE VIEW _gpu_time_ops AS
SELECT
  device_id,
  global_pid,
  start_ns,
  end_ns,
  max(end_ns) OVER (PARTITION BY device_id, global_pid ORDER BY start_ns, end_ns
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS busy_until_ns
FROM gpu_ops
WHERE end_ns > start_ns;

-- Idle gaps per GPU: before its first work, between its busy periods, after its last work.
CREATE VIEW _gpu_time_gaps AS
WITH
  spans AS (
    SELECT device_id, global_pid, min(start_ns) AS first_ns, max(end_ns) AS last_ns
    FROM _gpu_time_ops
    GROUP BY ALL
  ),
  edges AS (
    SELECT w.device_id, w.global_pid, w.start_ns AS window_start_ns, w.end_ns AS window_end_ns, s.first_ns, s.last_ns
    FROM _gpu_time_window AS w
    LEFT JOIN spans AS s USING (device_id, global_pid)
  )
SELECT device_id, global_pid, busy_until_ns AS start_ns, start_ns AS end_ns
FROM _gpu_time_ops
WHERE start_ns > busy_until_ns
UNION ALL
SELECT device_id, global_pid, window_start_ns, coalesce(first_ns, window_end_ns) FROM edges
WHERE coalesce(first_ns, window_end_ns) > window_start_ns
UNION ALL
SELECT device_id, global_pid, last_ns, window_end_ns FROM edges WHERE window_end_ns > last_ns;

-- Per GPU, its window cut into consecutive segments by its process's iterations' device intervals,
-- each labelled within, between or outside and with the iteration it lies in or after.
CREATE VIEW _gpu_time_segments AS
WITH
  device AS (
    SELECT global_pid, iteration, range_id, device_start_ns AS start_ns, device_end_ns AS end_ns
    FROM iterations_device
    WHERE device_start_ns IS NOT NULL AND global_pid IN (SELECT global_pid FROM gpu_time_gpus)
  ),
  ordered AS (
    SELECT
      *,
      lead(start_ns) OVER w AS next_start_ns,
      max(end_ns) OVER (w ROWS UNBOUNDED PRECEDING) AS busy_until_ns,
      arg_max(iteration, {'end_ns': end_ns, 'start_ns': start_ns, 'range_id': range_id})
        OVER (w ROWS UNBOUNDED PRECEDING) AS ended_last
    FROM device
    WINDOW w AS (PARTITION BY global_pid ORDER BY start_ns, end_ns, range_id)
  ),
  firsts AS (
    SELECT w.device_id, w.global_pid, w.start_ns AS window_start_ns, w.end_ns AS window_end_ns,
           min(d.start_ns) AS first_ns
    FROM _gpu_time_window AS w
    LEFT JOIN device AS d USING (global_pid)
    GROUP BY ALL
  ),
  segments AS (
    SELECT f.device_id, o.global_pid, o.start_ns,
           least(coalesce(o.next_start_ns, o.busy_until_ns), o.busy_until_ns) AS end_ns, 'within' AS kind, o.iteration
    FROM ordered AS o JOIN firsts AS f USING (global_pid)
    UNION ALL
    SELECT f.device_id, o.global_pid, o.busy_until_ns, o.next_start_ns, 'between', o.ended_last
    FROM ordered AS o JOIN firsts AS f USING (global_pid)
    WHERE o.next_start_ns > o.busy_until_ns
    UNION ALL
    SELECT f.device_id, o.global_pid, o.busy_until_ns, f.window_end_ns, 'outside', o.ended_last
    FROM ordered AS o JOIN firsts AS f USING (global_pid)
    WHERE o.next_start_ns IS NULL
    UNION ALL
    SELECT device_id, global_pid, window_start_ns, coalesce(first_ns, window_end_ns), 'outside', NULL FROM firsts
  )
SELECT global_pid, start_ns, end_ns, kind, iteration, device_id
FROM segments
WHERE end_ns > start_ns;

-- Idle spans, unordered: each gap cut where the segments of its process change.
CREATE VIEW gpu_time_idle_unsorted AS
WITH
  segments AS MATERIALIZED (SELECT * FROM _gpu_time_segments),
  gaps AS MATERIALIZED (SELECT * FROM _gpu_time_gaps)
SELECT i.device_id, i.global_pid, s.start_ns, least(s.end_ns, i.end_ns) AS end_ns, s.kind, s.iteration
FROM segments AS s
ASOF JOIN gaps AS i ON i.device_id = s.device_id AND i.global_pid = s.global_pid AND i.start_ns <= s.start_ns
WHERE s.start_ns < i.end_ns
UNION ALL
SELECT i.device_id, i.global_pid, i.start_ns, least(s.end_ns, i.end_ns), s.kind, s.iteration
FROM gaps AS i
ASOF JOIN segments AS s ON s.device_id = i.device_id AND s.global_pid = i.global_pid AND s.start_ns < i.start_ns
WHERE s.end_ns > i.start_ns;

-- Every idle span of every GPU, by kind, with the iteration it lies in or after.
CREATE VIEW gpu_time_idle (
  -- CUDA device id (gpu_ops.device_id).
  device_id,
  -- Global id of the process whose GPU work this is (processes.global_pid).
  global_pid,
  -- Start of the span, in ns since the capture started.
  start_ns,
  -- End of the span.
  end_ns,
  -- end_ns - start_ns.
  dur_ns,
  -- 'within' (inside an iteration's device interval), 'between' (after the device work of every iteration so far, before the next one's) or 'outside' (before the first iteration, after the last, or no iteration mapping).
  kind,
  -- The iteration the span lies in (within) or after (between, outside after the last); NULL before the first.
  iteration
) AS
SELECT device_id, global_pid, start_ns, end_ns, end_ns - start_ns, kind, iteration
FROM gpu_time_idle_unsorted
ORDER BY device_id, global_pid, start_ns;

-- Per GPU, its window, operations and busy time: gpu_time less the idle time by kind and the iterations,
-- for the views that add up the idle time their own way (gpu_time_summary, from the idle parts).
CREATE VIEW gpu_time_busy AS
WITH
  busy AS (
    SELECT device_id, global_pid,
           sum(greatest(end_ns - greatest(start_ns, coalesce(busy_until_ns, start_ns)), 0))::BIGINT AS busy_ns
    FROM _gpu_time_ops
    GROUP BY ALL
  ),
  ops AS (SELECT device_id, global_pid, count(*) AS gpu_ops FROM gpu_ops GROUP BY ALL)
SELECT w.device_id, w.global_pid, w.start_ns AS window_start_ns, w.end_ns AS window_end_ns,
       w.end_ns - w.start_ns AS window_ns, o.gpu_ops, coalesce(b.busy_ns, 0) AS busy_ns, w.source AS window_source
FROM _gpu_time_window AS w
JOIN ops AS o USING (device_id, global_pid)
LEFT JOIN busy AS b USING (device_id, global_pid);

-- Per GPU and process using it: the window split into busy and idle, and the idle by kind.
CREATE VIEW gpu_time (
  -- CUDA device id (gpu_ops.device_id).
  device_id,
  -- Global id of the process whose GPU work this is (processes.global_pid).
  global_pid,
  -- Operating-system process id.
  pid,
  -- Start of this GPU's window (window_source says which): the profiler's span, else its GPU work's first start, in ns since the capture started.
  window_start_ns,
  -- End of the window: the profiler's span, else its GPU work's last end.
  window_end_ns,
  -- window_end_ns - window_start_ns = busy_ns + idle_ns.
  window_ns,
  -- GPU operations (kernels, memcpys, memsets) of this process on this device.
  gpu_ops,
  -- Time any of them ran: the union of their intervals on all streams.
  busy_ns,
  -- window_ns - busy_ns = idle_within_ns + idle_between_ns + idle_outside_ns.
  idle_ns,
  -- Idle time inside iterations' device intervals.
  idle_within_ns,
  -- Idle time between iterations.
  idle_between_ns,
  -- Idle time outside iterations (before the first, after the last, or all of it without an iteration mapping).
  idle_outside_ns,
  -- busy_ns / window_ns (0 to 1).
  busy_share,
  -- Iterations of this process with a device interval (iterations.sql).
  iterations,
  -- What the window is: 'kineto trace span' (the PyTorch profiler's recording), 'kineto profiler steps' (its ProfilerStep annotations), each widened to hold all of the GPU's work, or 'GPU work' (its first start to last end).
  window_source
) AS
WITH
  idle AS (
    SELECT device_id, global_pid,
           sum(end_ns - start_ns) FILTER (WHERE kind = 'within')::BIGINT AS within_ns,
           sum(end_ns - start_ns) FILTER (WHERE kind = 'between')::BIGINT AS between_ns,
           sum(end_ns - start_ns) FILTER (WHERE kind = 'outside')::BIGINT AS outside_ns
    FROM gpu_time_idle_unsorted
    GROUP BY ALL
  ),
  its AS (
    SELECT global_pid, count(*) AS iterations FROM iterations_device WHERE device_start_ns IS NOT NULL GROUP BY ALL
  )
SELECT
  b.device_id,
  b.global_pid,
  (b.global_pid >> 24) & 16777215,
  b.window_start_ns,
  b.window_end_ns,
  b.window_ns,
  b.gpu_ops,
  b.busy_ns,
  b.window_ns - b.busy_ns,
  coalesce(i.within_ns, 0),
  coalesce(i.between_ns, 0),
  coalesce(i.outside_ns, 0),
  b.busy_ns / nullif(b.window_ns, 0),
  coalesce(t.iterations, 0),
  b.window_source
FROM gpu_time_busy AS b
LEFT JOIN idle AS i USING (device_id, global_pid)
LEFT JOIN its AS t USING (global_pid)
ORDER BY b.device_id, b.global_pid;

-- GPU operations by name: which kernels (and copies) took the GPU's time.
CREATE VIEW gpu_time_kernels (
  -- 'kernel', 'memcpy' or 'memset'.
  kind,
  -- The kernel's short name (gpu_ops.short_name), else the operation's name.
  name,
  -- Operations of this name.
  ops,
  -- Devices they ran on.
  gpus,
  -- Their summed durations (overlapping operations each count whole).
  total_ns,
  -- total_ns as a share of the summed durations of all GPU operations (0 to 1).
  share,
  -- Mean duration.
  mean_ns,
  -- Longest one.
  max_ns
) AS
SELECT kind, coalesce(short_name, name), count(*), count(DISTINCT device_id), sum(dur_ns)::BIGINT,
       sum(dur_ns) / nullif(sum(sum(dur_ns)) OVER (), 0), avg(dur_ns), max(dur_ns)
FROM gpu_ops
GROUP BY kind, coalesce(short_name, name)
ORDER BY sum(dur_ns) DESC, 2;
