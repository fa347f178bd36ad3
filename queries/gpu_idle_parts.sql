-- GPU idle parts: each idle span split by what the host of its process was doing, and idle time by cause.
--
-- Notes. The idle spans are gpu_time.sql's; each is split by the host activity of its process
-- (host_activity.sql: an NVTX leaf range on any thread, else the CUDA or HIP API call in flight on a
-- launching thread, else the Python frame that thread was in), and what no host interval covers is
-- `unattributed`, so a span's parts add up to the span. Each part also names the engine-level frame
-- its thread was in, where the trace has stack frames. A GPU's idle spans are disjoint, and so are
-- each level's winning pieces, so one sweep in time order over their starts and ends, with running
-- maxima, finds what is in flight between any two consecutive instants (below): the pieces of
-- host_activity, cut at the idle spans' edges, without joining every instant against each level.
--
-- @uses gpu_time, host_activity

-- The parts of each idle span, unordered. One sweep per GPU, in time order, over the starts and ends of
-- the pieces that won each level (host_activity_level_won) and the starts of the idle spans: between
-- two consecutive instants nothing starts or ends, so the idle span in flight, each level's piece in
-- flight and the winner (NVTX over CUDA over Python) hold throughout. A level's pieces are disjoint,
-- so the one that started last also ends last: the running maximum of its ends names it (and the
-- idle spans' likewise), one running aggregate per level rather than two. The winner's engine
-- frame is the one its thread was in at the latest start or end of a piece, as host_activity.sql reads
-- it for its pieces. The parts are added up by span, thread, cause and engine frame, and what no piece
-- covers is left to the span's unattributed part.
CREATE VIEW gpu_idle_parts_unsorted AS
WITH
  idle AS MATERIALIZED (SELECT * FROM gpu_time_idle_unsorted),
  levels AS MATERIALIZED (
    SELECT g.device_id, l.global_pid, l.start_ns, l.end_ns, l.global_tid, l.cause_id,
           CASE l.level WHEN 'nvtx' THEN 0 WHEN 'cuda' THEN 1 ELSE 2 END::TINYINT AS level
    FROM host_activity_level_won AS l JOIN gpu_time_gpus AS g USING (global_pid)
  ),
  -- event 0: a piece starts, 1: a piece ends, 2: an idle span starts; (ts, event, level) is unique per GPU
  events AS (
    SELECT device_id, global_pid, start_ns AS ts, 0::TINYINT AS event, level, end_ns FROM levels
    UNION ALL
    SELECT device_id, global_pid, end_ns, 1::TINYINT, level, NULL FROM levels
    UNION ALL
    SELECT device_id, global_pid, start_ns, 2::TINYINT, 3::TINYINT, end_ns FROM idle
  ),
  swept AS (
    SELECT device_id, global_pid, ts,
           lead(ts) OVER w AS next_ns,
           max(CASE WHEN event < 2 THEN ts END) OVER w AS cut_ns,
           max(CASE WHEN event = 0 AND level = 0 THEN end_ns END) OVER w AS nvtx_end_ns,
           max(CASE WHEN event = 0 AND level = 1 THEN end_ns END) OVER w AS cuda_end_ns,
           max(CASE WHEN event = 0 AND level = 2 THEN end_ns END) OVER w AS python_end_ns,
           max(CASE WHEN event = 2 THEN end_ns END) OVER w AS span_end_ns
    FROM events
    WINDOW w AS (PARTITION BY device_id, global_pid ORDER BY ts, event, level ROWS UNBOUNDED PRECEDING)
  ),
  won AS (
    SELECT device_id, global_pid, span_end_ns, cut_ns, least(next_ns, span_end_ns) - ts AS part_ns,
           CASE WHEN nvtx_end_ns > ts THEN 0 WHEN cuda_end_ns > ts THEN 1 ELSE 2 END::TINYINT AS level,
           CASE WHEN nvtx_end_ns > ts THEN nvtx_end_ns WHEN cuda_end_ns > ts THEN cuda_end_ns ELSE python_end_ns END
             AS end_ns
    FROM swept
    WHERE span_end_ns > ts AND next_ns > ts AND (nvtx_end_ns > ts OR cuda_end_ns > ts OR python_end_ns > ts)
  ),
  -- each cause's place in (cause_kind, cause) order, so that the parts sort on integers
  causes AS (SELECT *, row_number() OVER (ORDER BY cause_kind, cause)::INTEGER AS position FROM host_activity_causes),
  engine AS MATERIALIZED (
    SELECT f.global_tid, f.start_ns, f.end_ns, c.cause_id
    FROM host_activity_innermost(true) AS f
    JOIN nvtx_ranges AS r ON r.range_id = f.frame_id
    JOIN causes AS c ON c.cause = r.text AND c.cause_kind = 'python'
  ),
  pieces AS MATERIALIZED (
    SELECT w.device_id, w.global_pid, w.span_end_ns, w.cut_ns, w.part_ns, l.global_tid, l.cause_id,
           l.global_tid IN (SELECT global_tid FROM engine) AS framed
    FROM won AS w
    JOIN levels AS l USING (device_id, global_pid, level, end_ns)
  ),
  -- the engine frame, by an ASOF join only for the pieces whose thread has any
  framed AS (
    SELECT p.*, CASE WHEN e.end_ns > p.cut_ns THEN e.cause_id END AS engine_frame_id
    FROM pieces AS p
    ASOF LEFT JOIN engine AS e ON e.global_tid = p.global_tid AND e.start_ns <= p.cut_ns
    WHERE p.framed
    UNION ALL
    SELECT *, NULL FROM pieces WHERE NOT framed
  ),
  attributed AS MATERIALIZED (
    SELECT device_id, global_pid, span_end_ns AS end_ns, global_tid, cause_id, engine_frame_id,
           sum(part_ns)::BIGINT AS dur_ns
    FROM framed
    GROUP BY ALL
  ),
  covered AS (
    SELECT device_id, global_pid, end_ns, sum(dur_ns) AS dur_ns FROM attributed GROUP BY ALL
  )
SELECT a.device_id, a.global_pid, i.start_ns, a.end_ns, i.kind, i.iteration, c.cause_kind, c.cause, a.global_tid,
       e.cause AS engine_frame, a.dur_ns, c.position
FROM attributed AS a
JOIN idle AS i USING (device_id, global_pid, end_ns)
JOIN causes AS c ON c.cause_id = a.cause_id
LEFT JOIN causes AS e ON e.cause_id = a.engine_frame_id
UNION ALL
SELECT p.device_id, p.global_pid, p.start_ns, p.end_ns, p.kind, p.iteration, 'unattributed', 'unattributed', NULL,
       NULL, (p.end_ns - p.start_ns - coalesce(c.dur_ns, 0))::BIGINT, 2147483647
FROM idle AS p
LEFT JOIN covered AS c USING (device_id, global_pid, end_ns);

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
FROM gpu_idle_parts_unsorted
ORDER BY device_id, global_pid, start_ns, position, global_tid, engine_frame NULLS FIRST;
