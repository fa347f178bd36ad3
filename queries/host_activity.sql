-- Host activity: what the host threads of each process that ran GPU work were doing, as disjoint pieces of time.
--
-- Notes. Two kinds of host interval take part. NVTX leaves: push/pop ranges matching the phase
-- pattern (and domain) of the mapping, on any thread of the process, a leaf being one that holds
-- no other such range (host_gaps.sql's rule, so the same range is a phase in both). CUDA API calls:
-- the runtime and driver calls of the process's launching threads (the threads whose calls launched
-- GPU work), each clipped to the part that no earlier call on its thread already covers (by start,
-- longest first, then api_id), so that a driver call inside a runtime call counts as the runtime
-- call. On one thread each kind is disjoint.
-- At an instant where several are in flight, one wins: an NVTX leaf over any API call, and among
-- threads, the one that launched the most GPU work (then the lower global_tid). Threads are ranked
-- per process and per kind, and every thread takes part, however many there are.
--
-- How it is computed without comparing intervals pairwise: per process and kind, where one thread has
-- such intervals they are disjoint already and win as they are; where several do, a sweep in time
-- order finds the winner between two consecutive instants (a running XOR of bit strings, a bit per
-- thread). The API calls then count only where no leaf is: an intersection of two sets of disjoint
-- intervals, done by two ASOF joins as host_gaps.sql does. host_activity cuts the winners at every
-- start and end of any interval, so consecutive pieces may belong to the same interval.

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
    SELECT DISTINCT r.global_pid, r.global_tid
    FROM nvtx_ranges AS r
    JOIN _host_gaps_phase_names AS n ON n.text = r.text
    WHERE r.range_kind <> 'start_end'
      AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain())
      AND r.global_pid IN (SELECT global_pid FROM processes)
  )
SELECT t.global_pid, t.global_tid, 'nvtx' AS level,
       (row_number() OVER (PARTITION BY t.global_pid ORDER BY coalesce(l.launches, 0) DESC, t.global_tid) - 1)::INTEGER
         AS rank
FROM leaf_threads AS t LEFT JOIN launches AS l USING (global_pid, global_tid)
UNION ALL
SELECT global_pid, global_tid, 'cuda',
       (row_number() OVER (PARTITION BY global_pid ORDER BY launches DESC, global_tid) - 1)::INTEGER
FROM launches;

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
-- ranks them) and, after them, the CUDA and HIP API functions, each classed once by its name.
CREATE VIEW _host_activity_causes AS
WITH
  phases AS (SELECT DISTINCT phase_rank AS cause_id, 'nvtx' AS cause_kind, phase AS cause FROM _host_gaps_phase_names),
  names AS (SELECT unnest(list(DISTINCT name ORDER BY name)) AS name FROM cuda_api)
SELECT * FROM phases
UNION ALL
SELECT
  (coalesce((SELECT max(cause_id) FROM phases), 0) + row_number() OVER (ORDER BY name))::INTEGER,
  host_activity_api_class(name),
  name
FROM names
WHERE name IS NOT NULL;

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
    SELECT
      r.global_pid,
      r.global_tid,
      r.start_ns,
      coalesce(r.end_ns, (SELECT ts FROM last_ns)) AS end_ns,
      n.phase_rank AS cause_id,
      lead(r.start_ns) OVER (PARTITION BY r.global_tid ORDER BY r.start_ns, r.end_ns DESC NULLS FIRST, r.range_id)
        AS next_start_ns
    FROM nvtx_ranges AS r
    JOIN _host_gaps_phase_names AS n ON n.text = r.text
    WHERE r.range_kind <> 'start_end'
      AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain())
      AND r.global_tid IN (SELECT global_tid FROM ranks WHERE level = 'nvtx')
  ),
  leaves AS (
    SELECT global_pid, global_tid, start_ns, end_ns, cause_id
    FROM phases
    WHERE (next_start_ns IS NULL OR next_start_ns >= end_ns) AND end_ns > start_ns
  ),
  calls AS (
    SELECT a.global_pid, a.global_tid, a.start_ns, a.end_ns, c.cause_id,
           max(a.end_ns) OVER (PARTITION BY a.global_tid ORDER BY a.start_ns, a.end_ns DESC, a.api_id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until_ns
    FROM cuda_api AS a
    JOIN _host_activity_causes AS c ON c.cause = a.name AND c.cause_kind <> 'nvtx'
    WHERE a.end_ns > a.start_ns AND a.global_tid IN (SELECT global_tid FROM ranks WHERE level = 'cuda')
  ),
  clipped AS (
    SELECT global_pid, global_tid, greatest(start_ns, coalesce(covered_until_ns, start_ns)) AS start_ns, end_ns,
           cause_id
    FROM calls
    WHERE end_ns > coalesce(covered_until_ns, start_ns)
  ),
  both_kinds AS (
    SELECT *, 'nvtx' AS level FROM leaves
    UNION ALL
    SELECT *, 'cuda' FROM clipped
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
CREATE VIEW _host_activity_level_won AS
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

-- Per process, disjoint pieces of time, each with the interval that won it: the NVTX pieces, and the
-- CUDA pieces less the leaves. A call's piece first loses what the leaf in flight at its start covers
-- (the latest leaf to start at or before it: one ASOF join), which most often is all of it; what is
-- left loses the leaves that start inside it (the latest such rest to start at or before each leaf:
-- another), and keeps the spans between them.
CREATE VIEW _host_activity_won AS
WITH
  levels AS MATERIALIZED (SELECT * FROM _host_activity_level_won),
  nvtx AS (SELECT global_pid, start_ns, end_ns, global_tid, cause_id FROM levels WHERE level = 'nvtx'),
  cuda AS (SELECT global_pid, start_ns, end_ns, global_tid, cause_id FROM levels WHERE level = 'cuda'),
  rests AS MATERIALIZED (
    SELECT c.global_pid, greatest(c.start_ns, coalesce(n.end_ns, c.start_ns)) AS start_ns, c.end_ns, c.global_tid,
           c.cause_id
    FROM cuda AS c
    ASOF LEFT JOIN nvtx AS n ON n.global_pid = c.global_pid AND n.start_ns <= c.start_ns
    WHERE c.end_ns > coalesce(n.end_ns, c.start_ns)
  ),
  cuts AS (
    SELECT r.global_pid, r.start_ns AS rest_ns, n.start_ns, n.end_ns
    FROM nvtx AS n
    ASOF JOIN rests AS r ON r.global_pid = n.global_pid AND r.start_ns <= n.start_ns
    WHERE n.start_ns < r.end_ns
  ),
  spans AS (
    SELECT global_pid, rest_ns, end_ns AS start_ns,
           lead(start_ns) OVER (PARTITION BY global_pid, rest_ns ORDER BY start_ns) AS end_ns
    FROM cuts
    UNION ALL
    SELECT global_pid, rest_ns, rest_ns, min(start_ns) FROM cuts GROUP BY ALL
  )
SELECT * FROM nvtx
UNION ALL
SELECT r.* FROM rests AS r ANTI JOIN cuts AS k ON k.global_pid = r.global_pid AND k.rest_ns = r.start_ns
UNION ALL
SELECT r.global_pid, s.start_ns, least(coalesce(s.end_ns, r.end_ns), r.end_ns), r.global_tid, r.cause_id
FROM spans AS s
JOIN rests AS r ON r.global_pid = s.global_pid AND r.start_ns = s.rest_ns
WHERE least(coalesce(s.end_ns, r.end_ns), r.end_ns) > s.start_ns;

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
  -- 'nvtx' (a leaf range), or the CUDA API call's class: 'cuda_sync' (device, stream or event synchronize, a synchronous memcpy), 'cuda_launch', 'cuda_memcpy' (an asynchronous memcpy or a memset) or 'cuda_other'.
  cause_kind,
  -- The leaf's phase name (mapping_phase_name) or the API function's name.
  cause
) AS
WITH
  intervals AS MATERIALIZED (SELECT global_pid, start_ns, end_ns FROM _host_activity_intervals),
  instants AS (SELECT global_pid, start_ns AS ts FROM intervals UNION SELECT global_pid, end_ns FROM intervals),
  cuts AS (
    SELECT global_pid, ts AS start_ns, lead(ts) OVER (PARTITION BY global_pid ORDER BY ts) AS end_ns FROM instants
  )
SELECT p.global_pid, p.start_ns, p.end_ns, w.global_tid, c.cause_kind, c.cause
FROM cuts AS p
ASOF JOIN _host_activity_won AS w ON w.global_pid = p.global_pid AND w.start_ns <= p.start_ns
JOIN _host_activity_causes AS c ON c.cause_id = w.cause_id
WHERE p.end_ns IS NOT NULL AND w.end_ns > p.start_ns
ORDER BY p.global_pid, p.start_ns;
