-- Host activity: what the host threads of each process that ran GPU work were doing, as disjoint pieces of time.
--
-- Notes. Three kinds (levels) of host interval take part. NVTX leaves: push/pop ranges (or stack
-- frames) matching the phase pattern (and domain) of the mapping, on any thread of the process, a leaf
-- being one that holds no other such range (intervals_leaves, as host_gaps.sql finds them, so the same
-- range is a phase in both; one still open when the capture stopped holds every range after its start,
-- and runs to the last NVTX timestamp). CUDA API calls: the runtime and driver calls (CUDA's or HIP's)
-- of the process's launching threads (the threads whose calls launched GPU work), each clipped to the
-- part that no earlier call on its thread already covers (by start, longest first, then api_id), so
-- that a driver call inside a runtime call counts as the runtime call. Python frames: on a launching
-- thread of a trace with stack frames, the innermost frame at each instant (the function the thread was
-- in, `path(line): function`). On one thread each kind is disjoint.
-- At an instant where several are in flight, one wins: an NVTX leaf over any API call, an API call
-- over a frame, and among threads, the one that launched the most GPU work (then the lower
-- global_tid). Threads are ranked per process and per kind, and every thread takes part, however many
-- there are. Each piece also names the engine-level frame its thread was in: the innermost frame
-- matching an engine's frame phases (queries/presets.toml: input preparation, the forward pass,
-- sampling, the scheduler), so that an idle span reads as a line of the server's code.
--
-- How it is computed without comparing intervals pairwise: per process and kind, where one thread has
-- such intervals they are disjoint already and win as they are; where several do, a sweep in time order
-- finds the winner between two consecutive instants (a running XOR of bit strings, a bit per thread).
-- The kinds are then cut at every start and end of any of them (intervals_cuts), and each cut goes to
-- the highest kind in flight (one ASOF join per kind: a kind's pieces are disjoint). The innermost
-- frame comes from a sweep over each thread's frames: a frame is innermost from its start to the start
-- of its first child, and after each child's end until the next; consecutive pieces may belong to the
-- same interval.
--
-- @uses host_gaps, intervals, mapping_presets

-- Threads ranked per process and kind: those with phase ranges (nvtx) and those that launched GPU
-- work (cuda), the one that launched the most first, then by global_tid. Every thread takes part.
CREATE VIEW _host_activity_ranks AS
WITH
  processes AS (SELECT DISTINCT global_pid FROM gpu_ops),
  launches AS (
    SELECT a.global_pid, a.global_tid, count(*) AS launches
    FROM cuda_api AS a
    SEMI JOIN gpu_ops AS g ON g.global_pid = a.global_pid AND g.correlation_id = a.correlation_id
    GROUP BY ALL
  ),
  leaf_threads AS (
    SELECT DISTINCT global_pid, global_tid
    FROM host_gaps_phase_ranges
    WHERE global_pid IN (SELECT global_pid FROM processes)
  )
SELECT t.global_pid, t.global_tid, 'nvtx' AS level,
       (row_number() OVER (PARTITION BY t.global_pid ORDER BY coalesce(l.launches, 0) DESC, t.global_tid) - 1)::INTEGER
         AS rank
FROM leaf_threads AS t LEFT JOIN launches AS l USING (global_pid, global_tid)
UNION ALL
SELECT global_pid, global_tid, level,
       (row_number() OVER (PARTITION BY global_pid, level ORDER BY launches DESC, global_tid) - 1)::INTEGER
FROM launches CROSS JOIN (VALUES ('cuda'), ('python')) AS k(level);

-- The frames that stand for an engine's phases: the frame phases of every preset on Python stack frames.
CREATE MACRO host_activity_engine_frame_pattern() AS mapping_preset_frame_phases();

-- Per thread, the Python frame innermost at each instant, as disjoint pieces; with `engine_only`, of the
-- frames that match an engine's frame phases only (host_activity_engine_frame_pattern). Each frame
-- opens and closes (at one instant, closes first, the inner before the outer; opens outer first); its
-- depth is how many frames are open before it opens, and its parent the frame of one depth less that
-- opened last before it. After an open the frame opened is innermost, after a close its parent.
CREATE MACRO host_activity_innermost(engine_only) AS TABLE
WITH
  frames AS (
    SELECT range_id, global_pid, global_tid, start_ns, end_ns
    FROM nvtx_ranges
    WHERE range_kind = 'python_frame' AND end_ns > start_ns
      AND (NOT engine_only OR regexp_matches(text, host_activity_engine_frame_pattern()))
  ),
  edges AS (
    SELECT range_id, global_pid, global_tid, start_ns AS ts, 1 AS delta, range_id AS key FROM frames
    UNION ALL
    SELECT range_id, global_pid, global_tid, end_ns, -1, -range_id FROM frames
  ),
  ordered AS (
    SELECT *, sum(delta) OVER (PARTITION BY global_tid ORDER BY ts, delta, key ROWS UNBOUNDED PRECEDING) AS open_after,
           lead(ts) OVER (PARTITION BY global_tid ORDER BY ts, delta, key) AS next_ts
    FROM edges
  ),
  depths AS (SELECT range_id, global_tid, ts AS start_ns, open_after - 1 AS depth FROM ordered WHERE delta = 1),
  parents AS (
    SELECT c.range_id, p.range_id AS parent_id
    FROM depths AS c
    ASOF LEFT JOIN depths AS p ON p.global_tid = c.global_tid AND p.depth = c.depth - 1 AND p.range_id < c.range_id
  )
SELECT o.global_pid, o.global_tid, o.ts AS start_ns, o.next_ts AS end_ns,
       CASE WHEN o.delta = 1 THEN o.range_id ELSE p.parent_id END AS frame_id
FROM ordered AS o
JOIN parents AS p USING (range_id)
WHERE o.next_ts > o.ts AND (o.delta = 1 OR p.parent_id IS NOT NULL);

-- What a CUDA or HIP runtime (or driver) call does to the host, by its name: HIP's calls are classed
-- as their CUDA counterparts. 'cuda_sync': it waits for the device (a synchronize, or a copy that is
-- not Async, such as hipMemcpyWithStream or cudaMemcpy); 'cuda_launch': a kernel launch;
-- 'cuda_graph_launch': a graph launch; 'cuda_memcpy': an asynchronous copy; 'cuda_memset': a memset;
-- 'cuda_other': anything else (allocation, events, queries, attributes).
CREATE MACRO host_activity_api_class(name) AS CASE
  WHEN regexp_matches(name, '^(cu|cuda|hip)(Device|Stream|Event|Ctx|Thread)Synchronize')
    OR (regexp_matches(name, '^(cu|cuda|hip)Memcpy') AND NOT contains(name, 'Async')) THEN 'cuda_sync'
  WHEN regexp_matches(name, '^(cu|cuda|hip)GraphLaunch') THEN 'cuda_graph_launch'
  WHEN regexp_matches(name, '^(cu|cuda|hip)(Ext|Hcc)?(Module)?Launch') THEN 'cuda_launch'
  WHEN regexp_matches(name, '^(cu|cuda|hip)Memcpy') THEN 'cuda_memcpy'
  WHEN regexp_matches(name, '^(cu|cuda|hip)Memset') THEN 'cuda_memset'
  ELSE 'cuda_other'
END;

-- The causes an interval can stand for, each with an id: the phases (ids 1, 2, ... as host_gaps
-- ranks them), after them the CUDA and HIP API functions, each classed once by its name, and after
-- them the Python frames of the processes with GPU work (cause_kind python, the frame's text).
CREATE VIEW host_activity_causes AS
WITH
  phases AS (SELECT DISTINCT phase_rank AS cause_id, 'nvtx' AS cause_kind, phase AS cause FROM host_gaps_phase_names),
  names AS (SELECT unnest(list(DISTINCT name ORDER BY name)) AS name FROM cuda_api),
  calls AS (
    SELECT (coalesce((SELECT max(cause_id) FROM phases), 0) + row_number() OVER (ORDER BY name))::INTEGER AS cause_id,
           host_activity_api_class(name) AS cause_kind, name AS cause
    FROM names
    WHERE name IS NOT NULL
  ),
  frames AS (
    SELECT unnest(list(DISTINCT text ORDER BY text)) AS text FROM nvtx_ranges
    WHERE range_kind = 'python_frame' AND global_pid IN (SELECT global_pid FROM gpu_ops)
  )
SELECT * FROM phases
UNION ALL
SELECT * FROM calls
UNION ALL
SELECT (coalesce((SELECT max(cause_id) FROM calls), (SELECT max(cause_id) FROM phases), 0)
        + row_number() OVER (ORDER BY text))::INTEGER, 'python', text
FROM frames;

-- Every interval that takes part, with its level, rank and cause id: NVTX leaves, then each launching
-- thread's calls clipped to what its earlier calls left uncovered. A leaf still open when the
-- capture stopped runs to the last NVTX timestamp.
CREATE VIEW _host_activity_intervals AS
WITH
  ranks AS MATERIALIZED (
    SELECT *, count(*) OVER (PARTITION BY global_pid, level)::INTEGER AS threads FROM _host_activity_ranks
  ),
  last_ns AS (SELECT max(coalesce(end_ns, start_ns)) AS ts FROM nvtx_ranges),
  phases AS (
    SELECT global_tid AS key, range_id AS id, global_pid, start_ns, end_ns, phase_rank AS cause_id
    FROM host_gaps_phase_ranges
    WHERE global_tid IN (SELECT global_tid FROM ranks WHERE level = 'nvtx')
  ),
  leaves AS (
    SELECT global_pid, global_tid, start_ns, end_ns, cause_id
    FROM (SELECT global_pid, key AS global_tid, start_ns, coalesce(end_ns, (SELECT ts FROM last_ns)) AS end_ns, cause_id
          FROM intervals_leaves(phases))
    WHERE end_ns > start_ns
  ),
  calls AS (
    SELECT a.global_pid, a.global_tid, a.start_ns, a.end_ns, c.cause_id,
           max(a.end_ns) OVER (PARTITION BY a.global_tid ORDER BY a.start_ns, a.end_ns DESC, a.api_id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until_ns
    FROM cuda_api AS a
    JOIN host_activity_causes AS c ON c.cause = a.name AND c.cause_kind <> 'nvtx'
    WHERE a.end_ns > a.start_ns AND a.global_tid IN (SELECT global_tid FROM ranks WHERE level = 'cuda')
  ),
  clipped AS (
    SELECT global_pid, global_tid, greatest(start_ns, coalesce(covered_until_ns, start_ns)) AS start_ns, end_ns,
           cause_id
    FROM calls
    WHERE end_ns > coalesce(covered_until_ns, start_ns)
  ),
  frames AS (
    SELECT f.global_pid, f.global_tid, f.start_ns, f.end_ns, c.cause_id
    FROM host_activity_innermost(false) AS f
    JOIN nvtx_ranges AS r ON r.range_id = f.frame_id
    JOIN host_activity_causes AS c ON c.cause = r.text AND c.cause_kind = 'python'
    WHERE f.global_tid IN (SELECT global_tid FROM ranks WHERE level = 'python')
  ),
  both_kinds AS (
    SELECT *, 'nvtx' AS level FROM leaves
    UNION ALL
    SELECT *, 'cuda' FROM clipped
    UNION ALL
    SELECT *, 'python' FROM frames
  )
SELECT b.global_pid, b.global_tid, b.start_ns, b.end_ns, b.cause_id, b.level, k.rank, k.threads
FROM both_kinds AS b
JOIN ranks AS k ON k.global_tid = b.global_tid AND k.level = b.level;

-- Per process and level, disjoint pieces of time, each with the interval of that level that won it.
-- A level with one thread needs nothing: its intervals are its pieces. Where several threads share a
-- level, every interval toggles its rank's bit (of a bit string as long as the level has threads) at
-- its start and at its end; the running XOR of those toggles, in time order, is the set of ranks in
-- flight between two consecutive instants (a rank's intervals are disjoint), and its first set bit the
-- winner. The winning interval is then the latest of that rank to start at or before the piece.
CREATE VIEW host_activity_level_won AS
WITH
  intervals AS MATERIALIZED (SELECT * FROM _host_activity_intervals),
  shared AS (SELECT * FROM intervals WHERE threads > 1),
  toggles AS (
    SELECT global_pid, level, start_ns AS ts, set_bit(bitstring('0', threads), rank, 1) AS toggle FROM shared
    UNION ALL
    SELECT global_pid, level, end_ns, set_bit(bitstring('0', threads), rank, 1) FROM shared
  ),
  swept AS (
    -- a RANGE frame takes every toggle of the instant, so each XOR is the state just after it
    SELECT global_pid, level, ts,
           lead(ts) OVER (PARTITION BY global_pid, level ORDER BY ts) AS next_ts,
           bit_position('1'::BIT, bit_xor(toggle) OVER (PARTITION BY global_pid, level ORDER BY ts
                                                        RANGE UNBOUNDED PRECEDING))::INTEGER - 1 AS rank
    FROM toggles
  ),
  won AS (SELECT * FROM swept WHERE next_ts > ts AND rank >= 0)
SELECT global_pid, level, start_ns, end_ns, global_tid, cause_id FROM intervals WHERE threads = 1
UNION ALL
SELECT w.global_pid, w.level, w.ts, w.next_ts, i.global_tid, i.cause_id
FROM won AS w
ASOF JOIN shared AS i ON i.global_pid = w.global_pid AND i.level = w.level AND i.rank = w.rank AND i.start_ns <= w.ts;

-- Per process, disjoint pieces of time, each with the interval that won it and the engine-level frame
-- its thread was in: the levels cut at every start and end of any of them, each cut to the highest
-- level in flight over it (NVTX, then CUDA, then Python: the latest piece of a level to start at or
-- before the cut, if it still runs).
CREATE VIEW _host_activity_won AS
WITH
  levels AS MATERIALIZED (SELECT * FROM host_activity_level_won),
  nvtx AS (SELECT * FROM levels WHERE level = 'nvtx'),
  cuda AS (SELECT * FROM levels WHERE level = 'cuda'),
  python AS (SELECT * FROM levels WHERE level = 'python'),
  spans AS (SELECT global_pid AS key, start_ns, end_ns FROM levels),
  cuts AS (SELECT key AS global_pid, start_ns, end_ns FROM intervals_cuts(spans)),
  winners AS (
    SELECT
      c.global_pid, c.start_ns, c.end_ns,
      CASE WHEN n.end_ns > c.start_ns THEN n.global_tid WHEN u.end_ns > c.start_ns THEN u.global_tid
           WHEN p.end_ns > c.start_ns THEN p.global_tid END AS global_tid,
      CASE WHEN n.end_ns > c.start_ns THEN n.cause_id WHEN u.end_ns > c.start_ns THEN u.cause_id
           WHEN p.end_ns > c.start_ns THEN p.cause_id END AS cause_id
    FROM cuts AS c
    ASOF LEFT JOIN nvtx AS n ON n.global_pid = c.global_pid AND n.start_ns <= c.start_ns
    ASOF LEFT JOIN cuda AS u ON u.global_pid = c.global_pid AND u.start_ns <= c.start_ns
    ASOF LEFT JOIN python AS p ON p.global_pid = c.global_pid AND p.start_ns <= c.start_ns
  ),
  engine AS (
    SELECT f.global_tid, f.start_ns, f.end_ns, c.cause_id
    FROM host_activity_innermost(true) AS f
    JOIN nvtx_ranges AS r ON r.range_id = f.frame_id
    JOIN host_activity_causes AS c ON c.cause = r.text AND c.cause_kind = 'python'
  )
SELECT w.global_pid, w.start_ns, w.end_ns, w.global_tid, w.cause_id,
       CASE WHEN e.end_ns > w.start_ns THEN e.cause_id END AS engine_frame_id
FROM winners AS w
ASOF LEFT JOIN engine AS e ON e.global_tid = w.global_tid AND e.start_ns <= w.start_ns
WHERE w.cause_id IS NOT NULL;

-- Per process, disjoint pieces of time, each with the host interval that was in flight and won.
CREATE VIEW host_activity (
  -- Global id of the process (processes.global_pid).
  global_pid,
  -- Start of the piece, in ns since the capture started.
  start_ns,
  -- End of the piece: the next instant any taking part interval starts or ends.
  end_ns,
  -- The thread whose interval this is.
  global_tid,
  -- 'nvtx' (a leaf range), the CUDA or HIP API call's class (host_activity_api_class: 'cuda_sync', 'cuda_launch', 'cuda_graph_launch', 'cuda_memcpy', 'cuda_memset', 'cuda_other'), or 'python' (the thread's innermost stack frame).
  cause_kind,
  -- The leaf's phase name (mapping_phase_name), the API function's name, or the frame (`path(line): function`).
  cause,
  -- The engine-level frame the thread was in (an engine's frame phase: input preparation, the forward pass, sampling, the scheduler); NULL without one.
  engine_frame
) AS
WITH
  intervals AS MATERIALIZED (SELECT global_pid AS key, start_ns, end_ns FROM _host_activity_intervals),
  cuts AS (SELECT key AS global_pid, start_ns, end_ns FROM intervals_cuts(intervals))
SELECT p.global_pid, p.start_ns, p.end_ns, w.global_tid, c.cause_kind, c.cause, e.cause
FROM cuts AS p
ASOF JOIN _host_activity_won AS w ON w.global_pid = p.global_pid AND w.start_ns <= p.start_ns
JOIN host_activity_causes AS c ON c.cause_id = w.cause_id
LEFT JOIN host_activity_causes AS e ON e.cause_id = w.engine_frame_id
WHERE w.end_ns > p.start_ns
ORDER BY p.global_pid, p.start_ns;
