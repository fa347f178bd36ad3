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
-- per process and per kind; each rank is a bit of a BIGINT, so at most 31 threads with leaves and 31
-- launching threads per process take part (the rest, ranked last, are left out).
--
-- How it is computed without comparing intervals pairwise: every interval adds its bit (2^rank) at
-- its start and takes it off at its end. The running sum of those deltas, in time order per
-- process, is the set of intervals in flight between two consecutive instants (one per bit, since a
-- rank's intervals are disjoint), and its lowest set bit is the winner. The winning interval itself
-- is the latest of that rank to start at or before the piece (one sort-based ASOF join). Pieces are
-- cut at every start and end, so consecutive pieces may belong to the same interval.

-- Threads ranked per process and kind: those with phase ranges (nvtx) and those that launched GPU
-- work (cuda), the one that launched the most first, then by global_tid; bit 0-30 and 31-61.
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
    WHERE r.range_kind = 'push_pop'
      AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain())
      AND r.global_pid IN (SELECT global_pid FROM processes)
  ),
  ranked AS (
    SELECT t.global_pid, t.global_tid, 'nvtx' AS level,
           row_number() OVER (PARTITION BY t.global_pid ORDER BY coalesce(l.launches, 0) DESC, t.global_tid) - 1 AS rank
    FROM leaf_threads AS t LEFT JOIN launches AS l USING (global_pid, global_tid)
    UNION ALL
    SELECT global_pid, global_tid, 'cuda',
           row_number() OVER (PARTITION BY global_pid ORDER BY launches DESC, global_tid) - 1
    FROM launches
  )
SELECT global_pid, global_tid, level, (CASE level WHEN 'nvtx' THEN rank ELSE 31 + rank END)::INTEGER AS bit
FROM ranked
WHERE rank < 31;

-- The causes an interval can stand for, each with an id: the phases (ids 1, 2, ... as host_gaps
-- ranks them) and, after them, the CUDA API functions, each classed once by its name.
CREATE VIEW _host_activity_causes AS
WITH
  phases AS (SELECT DISTINCT phase_rank AS cause_id, 'nvtx' AS cause_kind, phase AS cause FROM _host_gaps_phase_names),
  names AS (SELECT unnest(list(DISTINCT name ORDER BY name)) AS name FROM cuda_api)
SELECT * FROM phases
UNION ALL
SELECT
  (coalesce((SELECT max(cause_id) FROM phases), 0) + row_number() OVER (ORDER BY name))::INTEGER,
  CASE
    WHEN regexp_matches(name, '^cu(da)?(Device|Stream|Event|Ctx)Synchronize')
      OR (regexp_matches(name, '^cu(da)?Memcpy') AND NOT contains(name, 'Async')) THEN 'cuda_sync'
    WHEN regexp_matches(name, '^cu(da)?(Launch|GraphLaunch)') THEN 'cuda_launch'
    WHEN regexp_matches(name, '^cu(da)?Mem(cpy|set)') THEN 'cuda_memcpy'
    ELSE 'cuda_other'
  END,
  name
FROM names
WHERE name IS NOT NULL;

-- Every interval that takes part, with its bit and cause id: NVTX leaves, then each launching
-- thread's calls clipped to what its earlier calls left uncovered. A leaf still open when the
-- capture stopped runs to the last NVTX timestamp.
CREATE VIEW _host_activity_intervals AS
WITH
  ranks AS MATERIALIZED (SELECT * FROM _host_activity_ranks),
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
    WHERE r.range_kind = 'push_pop'
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
SELECT b.global_pid, b.global_tid, b.start_ns, b.end_ns, b.cause_id, k.bit
FROM both_kinds AS b
JOIN ranks AS k ON k.global_tid = b.global_tid AND k.level = b.level;

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
  intervals AS MATERIALIZED (SELECT * FROM _host_activity_intervals),
  deltas AS (
    SELECT global_pid, start_ns AS ts, 1::BIGINT << bit AS delta FROM intervals
    UNION ALL
    SELECT global_pid, end_ns, -(1::BIGINT << bit) FROM intervals
  ),
  flying AS (
    -- at each instant, the bits in flight after every delta of that instant (a RANGE frame takes its peers)
    SELECT
      global_pid,
      ts,
      lead(ts) OVER (PARTITION BY global_pid ORDER BY ts) AS next_ts,
      sum(delta) OVER (PARTITION BY global_pid ORDER BY ts RANGE UNBOUNDED PRECEDING) AS in_flight
    FROM deltas
  ),
  won AS (
    SELECT global_pid, ts AS start_ns, next_ts AS end_ns, bit_count((in_flight & -in_flight) - 1)::INTEGER AS bit
    FROM flying
    WHERE next_ts > ts AND in_flight <> 0
  )
SELECT w.global_pid, w.start_ns, w.end_ns, i.global_tid, c.cause_kind, c.cause
FROM won AS w
ASOF JOIN intervals AS i ON i.global_pid = w.global_pid AND i.bit = w.bit AND i.start_ns <= w.start_ns
JOIN _host_activity_causes AS c ON c.cause_id = i.cause_id
ORDER BY w.global_pid, w.start_ns;
