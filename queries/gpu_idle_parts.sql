-- GPU idle parts: each idle span split by what the host of its process was doing, and idle time by cause.
--
-- Notes. The idle spans are gpu_time.sql's; each is split by the host activity of its process
-- (host_activity.sql: an NVTX leaf range on any thread, else the CUDA or HIP API call in flight on a
-- launching thread, else the Python frame that thread was in), and what no host interval covers is
-- `unattributed`, so a span's parts add up to the span. Each part also names the engine-level frame
-- its thread was in, where the trace has stack frames. A GPU's idle spans are disjoint, and so are
-- each level's winning pieces, so one sweep in time order over their starts, with running maxima of
-- their ends, finds what is in flight between any two consecutive starts and where each of it ends
-- (below): the pieces of host_activity, cut at the idle spans' edges, without joining every instant
-- against each level. The sweep is a sort and a streaming window over all GPUs at once, each running
-- maximum packing the GPU with the instant, so that DuckDB holds only the values in flight rather than
-- a window's whole input.
--
-- @uses gpu_time, host_activity

-- A sweep's running value: a GPU's number, an instant and an id (< 2^32), packed into one HUGEINT so that
-- one running maximum over all GPUs, in (GPU, time) order, carries the three: the latest GPU first, then
-- the latest instant, and the id with it. Two such values of one GPU compare as their instants do.
CREATE MACRO _gpu_idle_parts_key(gpu, ns, id) AS
  (((gpu::HUGEINT << 64) + ns::HUGEINT + 9223372036854775808) << 32) + id;

-- The instant of a packed value.
CREATE MACRO _gpu_idle_parts_ns(v) AS (((v >> 32) & 18446744073709551615) - 9223372036854775808)::BIGINT;

-- The id of a packed value.
CREATE MACRO _gpu_idle_parts_id(v) AS (v & 4294967295)::BIGINT;

-- The parts of each idle span, unordered. One sweep over all GPUs, in (GPU, time) order, over the starts
-- of the pieces that won each level (host_activity_level_won) and of the idle spans. A level's pieces
-- are disjoint, so the one that started last also ends last: the running maximum of its ends names the
-- level's piece in flight, if that end is still ahead (and the idle spans' likewise), one running maximum
-- per level. Between two consecutive starts nothing starts, so each level's piece in flight runs on to
-- its end: NVTX wins up to its end, then CUDA up to its own, then Python, and the rest of the span is
-- its unattributed part. Each maximum packs the GPU, the end and an id (the span, or the piece's thread
-- and cause) into one value (_gpu_idle_parts_key), so that the sweep needs no partitions: DuckDB runs it
-- as one sort and a streaming window that holds only the values in flight, not a window over all of a
-- GPU's events; the sweep checks that its rows come in order. Each part's engine frame is the one its
-- thread was in at the latest start or end of a piece, as host_activity.sql reads it for its pieces: on
-- a GPU whose process has engine frames, the pieces' ends are events of the sweep too, so that no piece
-- ends between two of them. The parts are added up by span, thread, cause and engine frame; every span
-- has an unattributed part (0 when pieces cover it all).
CREATE VIEW gpu_idle_parts_unsorted AS
WITH
  gpus AS MATERIALIZED (
    SELECT device_id, global_pid, row_number() OVER (ORDER BY device_id, global_pid) AS gpu FROM gpu_time_gpus
  ),
  idle AS MATERIALIZED (
    SELECT i.*, g.gpu, row_number() OVER () AS span_id
    FROM gpu_time_idle_unsorted AS i JOIN gpus AS g USING (device_id, global_pid)
  ),
  -- each cause's place in (cause_kind, cause) order, so that the parts sort on integers
  causes AS (SELECT *, row_number() OVER (ORDER BY cause_kind, cause)::INTEGER AS position FROM host_activity_causes),
  engine AS MATERIALIZED (
    SELECT f.global_pid, f.global_tid, f.start_ns, f.end_ns, c.cause_id
    FROM host_activity_innermost(true) AS f
    JOIN nvtx_ranges AS r ON r.range_id = f.frame_id
    JOIN causes AS c ON c.cause = r.text AND c.cause_kind = 'python'
  ),
  won AS MATERIALIZED (SELECT * FROM host_activity_level_won WHERE global_pid IN (SELECT global_pid FROM gpus)),
  -- the (thread, cause) pairs that win pieces, each with an id
  whos AS MATERIALIZED (
    SELECT global_tid, cause_id, row_number() OVER () AS who, global_tid IN (SELECT global_tid FROM engine) AS framed
    FROM (SELECT DISTINCT global_tid, cause_id FROM won)
  ),
  -- the GPUs whose process has a thread with engine frames: there the pieces' ends are events as well
  framed_gpus AS (SELECT gpu FROM gpus WHERE global_pid IN (SELECT global_pid FROM engine)),
  -- code: 0, 1, 2 a piece of that level starts (NVTX, CUDA, Python), 4, 5, 6 one ends (on the GPUs above),
  -- 11 an idle span starts; (gpu, ts, code) is unique
  events AS (
    SELECT g.gpu, l.start_ns AS ts, (CASE l.level WHEN 'nvtx' THEN 0 WHEN 'cuda' THEN 1 ELSE 2 END)::TINYINT AS code,
           _gpu_idle_parts_key(g.gpu, l.end_ns, w.who) AS v
    FROM won AS l JOIN gpus AS g USING (global_pid) JOIN whos AS w USING (global_tid, cause_id)
    UNION ALL
    SELECT g.gpu, l.end_ns, (CASE l.level WHEN 'nvtx' THEN 4 WHEN 'cuda' THEN 5 ELSE 6 END)::TINYINT, NULL
    FROM won AS l JOIN gpus AS g USING (global_pid)
    WHERE g.gpu IN (SELECT gpu FROM framed_gpus)
    UNION ALL
    SELECT gpu, start_ns, 11::TINYINT, _gpu_idle_parts_key(gpu, end_ns, span_id) FROM idle
  ),
  ordered AS (SELECT * FROM events ORDER BY gpu, ts, code),
  swept AS (
    SELECT gpu, ts, code,
           lead(gpu) OVER () AS next_gpu, lead(ts) OVER () AS next_ts, lead(code) OVER () AS next_code,
           max(CASE WHEN code < 8 THEN _gpu_idle_parts_key(gpu, ts, 0) END) OVER w AS cut_v,
           max(CASE WHEN code = 0 THEN v END) OVER w AS nvtx_v,
           max(CASE WHEN code = 1 THEN v END) OVER w AS cuda_v,
           max(CASE WHEN code = 2 THEN v END) OVER w AS python_v,
           max(CASE WHEN code = 11 THEN v END) OVER w AS span_v
    FROM ordered
    WINDOW w AS (ROWS UNBOUNDED PRECEDING)
  ),
  -- the rows inside an idle span; after_v: the least packed value of this GPU past this instant
  stepped AS (
    SELECT *, _gpu_idle_parts_key(gpu, ts::HUGEINT + 1, 0) AS after_v,
           least(coalesce(CASE WHEN next_gpu = gpu THEN next_ts END, _gpu_idle_parts_ns(span_v)),
                 _gpu_idle_parts_ns(span_v)) AS to_ns
    FROM swept
    WHERE CASE
      WHEN (next_gpu, next_ts, next_code) < (gpu, ts, code)
        THEN error('gpu_idle_parts: the sweep''s rows came out of (GPU, time) order')
      ELSE span_v >= after_v AND to_ns > ts END
  ),
  -- each row's stretch [ts, to_ns) of a span, up to the next event or the span's end, and where in it
  -- each level's piece in flight ends (ts: none in flight)
  parts AS MATERIALIZED (
    SELECT _gpu_idle_parts_id(span_v) AS span_id, _gpu_idle_parts_ns(cut_v) AS cut_ns, ts, to_ns,
           CASE WHEN nvtx_v >= after_v THEN least(_gpu_idle_parts_ns(nvtx_v), to_ns) ELSE ts END AS nvtx_ns,
           CASE WHEN cuda_v >= after_v THEN least(_gpu_idle_parts_ns(cuda_v), to_ns) ELSE ts END AS cuda_ns,
           CASE WHEN python_v >= after_v THEN least(_gpu_idle_parts_ns(python_v), to_ns) ELSE ts END AS python_ns,
           _gpu_idle_parts_id(nvtx_v) AS nvtx_who, _gpu_idle_parts_id(cuda_v) AS cuda_who,
           _gpu_idle_parts_id(python_v) AS python_who
    FROM stepped
  ),
  -- NVTX up to its piece's end, CUDA from there to its own, Python from there; the rest unattributed (who NULL)
  pieces AS (
    SELECT span_id, cut_ns, nvtx_who AS who, nvtx_ns - ts AS part_ns FROM parts WHERE nvtx_ns > ts
    UNION ALL
    SELECT span_id, cut_ns, cuda_who, cuda_ns - greatest(ts, nvtx_ns) FROM parts WHERE cuda_ns > greatest(ts, nvtx_ns)
    UNION ALL
    SELECT span_id, cut_ns, python_who, python_ns - greatest(ts, nvtx_ns, cuda_ns) FROM parts
    WHERE python_ns > greatest(ts, nvtx_ns, cuda_ns)
    UNION ALL
    SELECT span_id, NULL, NULL, to_ns - greatest(ts, nvtx_ns, cuda_ns, python_ns) FROM parts
    WHERE to_ns > greatest(ts, nvtx_ns, cuda_ns, python_ns)
  ),
  -- the engine frame, by an ASOF join only for the parts whose thread has any
  framed AS (
    SELECT p.span_id, p.who, CASE WHEN e.end_ns > p.cut_ns THEN e.cause_id END AS engine_frame_id, p.part_ns
    FROM (SELECT p.*, w.global_tid FROM pieces AS p JOIN whos AS w USING (who) WHERE w.framed) AS p
    ASOF LEFT JOIN engine AS e ON e.global_tid = p.global_tid AND e.start_ns <= p.cut_ns
    UNION ALL
    SELECT p.span_id, p.who, NULL, p.part_ns FROM pieces AS p SEMI JOIN whos AS w ON w.who = p.who AND NOT w.framed
    UNION ALL
    -- unattributed: the parts no piece won, and 0 for every span, so that each span has the row
    SELECT span_id, NULL, NULL, part_ns FROM pieces WHERE who IS NULL
    UNION ALL
    SELECT span_id, NULL, NULL, 0 FROM idle
  ),
  attributed AS (
    SELECT span_id, who, engine_frame_id, sum(part_ns)::BIGINT AS dur_ns FROM framed GROUP BY ALL
  )
SELECT i.device_id, i.global_pid, i.start_ns, i.end_ns, i.kind, i.iteration,
       coalesce(c.cause_kind, 'unattributed') AS cause_kind, coalesce(c.cause, 'unattributed') AS cause, w.global_tid,
       e.cause AS engine_frame, a.dur_ns, coalesce(c.position, 2147483647) AS position
FROM attributed AS a
JOIN idle AS i USING (span_id)
LEFT JOIN whos AS w USING (who)
LEFT JOIN causes AS c ON c.cause_id = w.cause_id
LEFT JOIN causes AS e ON e.cause_id = a.engine_frame_id;

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
