-- GPU idle parts: each idle span split by what the host of its process was doing, and idle time by cause.
--
-- Notes. The idle spans are gpu_time.sql's; each is split by the host activity of its process
-- (host_activity.sql: an NVTX leaf range on any thread, else the CUDA or HIP API call in flight on a
-- launching thread, else the Python frame that thread was in), and what no host interval covers is
-- `unattributed`, so a span's parts add up to the span. Each part also names the engine-level frame
-- its thread was in, where the trace has stack frames. A GPU's idle spans are disjoint, and so are the pieces its process's host intervals won,
-- so their intersection is two ASOF joins (a span starting inside a piece, or a piece starting
-- inside a span), as host_gaps.sql does for gaps.
--
-- @uses gpu_time, host_activity

-- The parts of each idle span, unordered: its intersections with the winning host pieces, added up
-- by thread and cause, and what no piece covers, left to its unattributed part.
CREATE VIEW _gpu_idle_parts AS
WITH
  idle AS MATERIALIZED (SELECT * FROM _gpu_time_idle),
  won AS MATERIALIZED (
    SELECT g.device_id, w.* FROM _host_activity_won AS w JOIN _gpu_time_gpus AS g USING (global_pid)
  ),
  pieces AS (
    SELECT i.*, w.global_tid, w.cause_id, w.engine_frame_id, least(i.end_ns, w.end_ns) - i.start_ns AS part_ns
    FROM idle AS i
    ASOF JOIN won AS w ON w.device_id = i.device_id AND w.global_pid = i.global_pid AND w.start_ns <= i.start_ns
    WHERE i.start_ns < w.end_ns
    UNION ALL
    SELECT i.*, w.global_tid, w.cause_id, w.engine_frame_id, least(i.end_ns, w.end_ns) - w.start_ns
    FROM won AS w
    ASOF JOIN idle AS i ON i.device_id = w.device_id AND i.global_pid = w.global_pid AND i.start_ns < w.start_ns
    WHERE w.start_ns < i.end_ns
  ),
  attributed AS MATERIALIZED (
    SELECT device_id, global_pid, start_ns, global_tid, cause_id, engine_frame_id, any_value(end_ns) AS end_ns,
           any_value(kind) AS kind, any_value(iteration) AS iteration, sum(part_ns)::BIGINT AS dur_ns
    FROM pieces
    GROUP BY device_id, global_pid, start_ns, global_tid, cause_id, engine_frame_id
  ),
  covered AS (
    SELECT device_id, global_pid, start_ns, sum(dur_ns) AS dur_ns FROM attributed GROUP BY ALL
  ),
  -- each cause's place in (cause_kind, cause) order, so that the parts sort on integers
  causes AS (SELECT *, row_number() OVER (ORDER BY cause_kind, cause)::INTEGER AS position FROM _host_activity_causes)
SELECT a.device_id, a.global_pid, a.start_ns, a.end_ns, a.kind, a.iteration, c.cause_kind, c.cause, a.global_tid,
       e.cause AS engine_frame, a.dur_ns, c.position
FROM attributed AS a
JOIN causes AS c ON c.cause_id = a.cause_id
LEFT JOIN causes AS e ON e.cause_id = a.engine_frame_id
UNION ALL
SELECT p.device_id, p.global_pid, p.start_ns, p.end_ns, p.kind, p.iteration, 'unattributed', 'unattributed', NULL,
       NULL, (p.end_ns - p.start_ns - coalesce(c.dur_ns, 0))::BIGINT, 2147483647
FROM idle AS p
LEFT JOIN covered AS c USING (device_id, global_pid, start_ns);

-- Each idle span split by what the host was doing meanwhile; a span's parts add up to its length.
CREATE VIEW gpu_idle_parts (
  -- CUDA device id (gpu_ops.device_id).
  device_id,
  -- Global id of the process whose GPU work this is.
  global_pid,
  -- Start of the idle span (gpu_time_idle.start_ns).
  idle_start_ns,
  -- End of the idle span.
  idle_end_ns,
  -- Kind of the idle span: within, between or outside (gpu_time_idle.kind).
  kind,
  -- The iteration the span lies in or after (gpu_time_idle.iteration).
  iteration,
  -- 'nvtx' (an NVTX leaf range), 'cuda_sync', 'cuda_launch', 'cuda_graph_launch', 'cuda_memcpy', 'cuda_memset', 'cuda_other' (the CUDA or HIP API call in flight on a launching thread), 'python' (the Python frame it was in), or 'unattributed'.
  cause_kind,
  -- The leaf's phase name, the API function's name or the frame (`path(line): function`); 'unattributed' for time no host interval covers.
  cause,
  -- The thread the cause ran on; NULL for unattributed.
  global_tid,
  -- Time of the span with this cause; every span has an unattributed row, possibly 0.
  dur_ns,
  -- The engine-level frame that thread was in (input preparation, the forward pass, sampling, the scheduler: an engine's frame phases); NULL without stack frames or outside them.
  engine_frame
) AS
SELECT device_id, global_pid, start_ns, end_ns, kind, iteration, cause_kind, cause, global_tid, dur_ns, engine_frame
FROM _gpu_idle_parts
ORDER BY device_id, global_pid, start_ns, position, global_tid, engine_frame NULLS FIRST;

-- Per GPU and cause, the idle time it took: what the host was doing while each GPU sat idle.
CREATE VIEW gpu_time_causes (
  -- CUDA device id.
  device_id,
  -- Global id of the process.
  global_pid,
  -- gpu_idle_parts.cause_kind.
  cause_kind,
  -- gpu_idle_parts.cause.
  cause,
  -- Idle time with this cause.
  idle_ns,
  -- idle_ns as a share of the GPU's idle time (0 to 1).
  idle_share,
  -- Of it, idle time within iterations.
  within_ns,
  -- Of it, idle time between iterations.
  between_ns,
  -- Of it, idle time outside iterations.
  outside_ns,
  -- Idle spans with some time of this cause.
  spans
) AS
WITH
  causes AS (
    SELECT device_id, global_pid, cause_kind, cause, sum(dur_ns)::BIGINT AS idle_ns,
           sum(dur_ns) FILTER (WHERE kind = 'within')::BIGINT AS within_ns,
           sum(dur_ns) FILTER (WHERE kind = 'between')::BIGINT AS between_ns,
           sum(dur_ns) FILTER (WHERE kind = 'outside')::BIGINT AS outside_ns,
           count(*) FILTER (WHERE dur_ns > 0) AS spans
    FROM _gpu_idle_parts
    GROUP BY ALL
  )
SELECT device_id, global_pid, cause_kind, cause, idle_ns,
       idle_ns / nullif(sum(idle_ns) OVER (PARTITION BY device_id, global_pid), 0),
       coalesce(within_ns, 0), coalesce(between_ns, 0), coalesce(outside_ns, 0), spans
FROM causes
WHERE idle_ns > 0
ORDER BY device_id, global_pid, idle_ns DESC, cause_kind, cause;

-- One row per GPU and process: busy and idle shares of the window, and the largest idle causes.
CREATE VIEW gpu_time_summary (
  -- CUDA device id.
  device_id,
  -- Global id of the process.
  global_pid,
  -- The capture window (gpu_time.window_ns).
  window_ns,
  -- Share of the window the GPU was busy (0 to 1).
  busy_share,
  -- Share of the window it sat idle within iterations.
  idle_within_share,
  -- Share of the window it sat idle between iterations.
  idle_between_share,
  -- Share of the window it sat idle outside iterations.
  idle_outside_share,
  -- Kind of the cause that took the most idle time (gpu_time_causes.cause_kind).
  top_cause_kind,
  -- That cause.
  top_cause,
  -- Its share of the GPU's idle time (0 to 1).
  top_cause_share,
  -- The three largest causes, each as 'cause (kind): share of idle time'.
  top_causes,
  -- The window the shares divide by (gpu_time.window_source): the profiler's span, or the GPU work's.
  window_source
) AS
WITH
  ranked AS (
    SELECT *, row_number() OVER (PARTITION BY device_id, global_pid ORDER BY idle_ns DESC, cause_kind, cause) AS position
    FROM gpu_time_causes
  ),
  tops AS (
    SELECT device_id, global_pid,
           any_value(cause_kind) FILTER (WHERE position = 1) AS cause_kind,
           any_value(cause) FILTER (WHERE position = 1) AS cause,
           any_value(idle_share) FILTER (WHERE position = 1) AS share,
           list(cause || ' (' || cause_kind || '): ' || round(100 * idle_share, 1)::VARCHAR || '%' ORDER BY position)
             FILTER (WHERE position <= 3) AS top_causes
    FROM ranked
    GROUP BY ALL
  )
SELECT t.device_id, t.global_pid, t.window_ns, t.busy_share,
       t.idle_within_ns / nullif(t.window_ns, 0), t.idle_between_ns / nullif(t.window_ns, 0),
       t.idle_outside_ns / nullif(t.window_ns, 0), c.cause_kind, c.cause, c.share, c.top_causes, t.window_source
FROM gpu_time AS t
LEFT JOIN tops AS c USING (device_id, global_pid)
ORDER BY t.device_id, t.global_pid;
