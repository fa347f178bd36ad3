-- Host activity: what the host threads of each process that ran GPU work were doing, as disjoint pieces of time.
--
-- Notes. Two kinds of host interval take part. NVTX leaves: push/pop ranges matching the phase
-- pattern (and domain) of the mapping, on any thread of the process, a leaf being one that holds
-- no other such range (host_gaps.sql's rule, so the same range is a phase in both). CUDA API calls:
-- the runtime and driver calls of the process's launching threads (the threads whose calls launched
-- GPU work), each clipped to the part that no earlier call on its thread already covers (by start,
-- longest first, then api_id), so that a driver call inside a runtime call counts as the runtime call. On one thread each kind is disjoint.
-- At an instant where several are in flight, one wins: an NVTX leaf over any API call, and among
-- threads, the one that launched the most GPU work (then the lower global_tid). Threads are ranked
-- per process and per kind; each rank is a bit, so at most 63 threads with leaves and 63 launching
-- threads per process take part (the rest, ranked last, are left out).
--
-- How it is computed without comparing intervals pairwise: every interval adds its bit (2^rank) at
-- its start and takes it off at its end. The running sum of those deltas, in time order per
-- process, is the set of intervals in flight between two consecutive instants (one per bit, since a
-- rank's intervals are disjoint), and its lowest set bit is the winner. The winning interval itself
-- is the latest of that rank to start at or before the piece (one sort-based ASOF join). Pieces are
-- cut at every start and end, so consecutive pieces may belong to the same interval.

-- CUDA API calls of processes with GPU work, with how each is classed and whether it launched work.
-- Each function name is classed once (a capture holds millions of calls but few names).
CREATE VIEW _host_activity_calls AS
WITH
  launched AS (
    SELECT DISTINCT global_pid, correlation_id FROM gpu_ops
  ),
  names AS (SELECT unnest(list(DISTINCT name)) AS name FROM cuda_api),
  classes AS (
    SELECT
      name,
      CASE
        WHEN regexp_matches(name, '^cu(da)?(Device|Stream|Event|Ctx)Synchronize')
          OR (regexp_matches(name, '^cu(da)?Memcpy') AND NOT contains(name, 'Async')) THEN 'cuda_sync'
        WHEN regexp_matches(name, '^cu(da)?(Launch|GraphLaunch)') THEN 'cuda_launch'
        WHEN regexp_matches(name, '^cu(da)?Mem(cpy|set)') THEN 'cuda_memcpy'
        ELSE 'cuda_other'
      END AS cause_kind
    FROM names
  )
SELECT
  a.api_id,
  a.global_pid,
  a.global_tid,
  a.start_ns,
  a.end_ns,
  a.name,
  l.correlation_id IS NOT NULL AS launched,
  c.cause_kind
FROM cuda_api AS a
JOIN classes AS c ON c.name = a.name
LEFT JOIN launched AS l ON l.global_pid = a.global_pid AND l.correlation_id = a.correlation_id
WHERE a.global_pid IN (SELECT global_pid FROM gpu_ops) AND a.end_ns > a.start_ns;

-- Threads ranked per process and kind, the thread that launched the most GPU work first.
CREATE VIEW _host_activity_ranks AS
WITH
  launches AS (
    SELECT global_pid, global_tid, count(*) FILTER (WHERE launched) AS launches
    FROM _host_activity_calls
    GROUP BY ALL
  ),
  leaf_threads AS (
    SELECT DISTINCT r.global_pid, r.global_tid
    FROM nvtx_ranges AS r
    JOIN _host_gaps_phase_names AS n ON n.text = r.text
    WHERE r.range_kind = 'push_pop' AND r.global_pid IN (SELECT global_pid FROM gpu_ops)
      AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain())
  ),
  ranked AS (
    SELECT t.global_pid, t.global_tid, 'nvtx' AS level,
           row_number() OVER (PARTITION BY t.global_pid ORDER BY coalesce(l.launches, 0) DESC, t.global_tid) - 1 AS rank
    FROM leaf_threads AS t LEFT JOIN launches AS l USING (global_pid, global_tid)
    UNION ALL
    SELECT global_pid, global_tid, 'cuda',
           row_number() OVER (PARTITION BY global_pid ORDER BY launches DESC, global_tid) - 1
    FROM launches
    WHERE launches > 0
  )
SELECT global_pid, global_tid, level, (CASE level WHEN 'nvtx' THEN rank ELSE 63 + rank END)::INTEGER AS bit
FROM ranked
WHERE rank < 63;

-- Every interval that takes part, with its bit: NVTX leaves, then each launching thread's calls
-- clipped to what its earlier calls left uncovered. A leaf still open at the end of the capture
-- runs to the last timestamp of its process.
CREATE VIEW _host_activity_intervals AS
WITH
  process_end AS (
    SELECT global_pid, max(coalesce(end_ns, start_ns)) AS end_ns FROM nvtx_ranges GROUP BY global_pid
  ),
  phases AS (
    SELECT
      r.global_pid,
      r.global_tid,
      r.start_ns,
      coalesce(r.end_ns, e.end_ns) AS end_ns,
      n.phase,
      lead(r.start_ns) OVER (PARTITION BY r.global_tid ORDER BY r.start_ns, r.end_ns DESC NULLS FIRST, r.range_id)
        AS next_start_ns
    FROM nvtx_ranges AS r
    JOIN _host_gaps_phase_names AS n ON n.text = r.text
    JOIN process_end AS e ON e.global_pid = r.global_pid
    WHERE r.range_kind = 'push_pop'
      AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain())
      AND r.global_pid IN (SELECT global_pid FROM gpu_ops)
  ),
  leaves AS (
    SELECT global_pid, global_tid, start_ns, end_ns, 'nvtx' AS cause_kind, phase AS cause
    FROM phases
    WHERE (next_start_ns IS NULL OR next_start_ns >= end_ns) AND end_ns > start_ns
  ),
  calls AS (
    SELECT c.*, max(c.end_ns) OVER (PARTITION BY c.global_tid ORDER BY c.start_ns, c.end_ns DESC, c.api_id
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until_ns
    FROM _host_activity_calls AS c
    SEMI JOIN _host_activity_ranks AS k ON k.global_tid = c.global_tid AND k.level = 'cuda'
  ),
  clipped AS (
    SELECT global_pid, global_tid, greatest(start_ns, coalesce(covered_until_ns, start_ns)) AS start_ns, end_ns,
           cause_kind, name AS cause
    FROM calls
    WHERE end_ns > coalesce(covered_until_ns, start_ns)
  ),
  both_kinds AS (
    SELECT *, 'nvtx' AS level FROM leaves
    UNION ALL
    SELECT *, 'cuda' FROM clipped
  )
SELECT b.global_pid, b.global_tid, b.start_ns, b.end_ns, b.cause_kind, b.cause, k.bit
FROM both_kinds AS b
JOIN _host_activity_ranks AS k ON k.global_tid = b.global_tid AND k.level = b.level;

-- The pieces of host_activity, unordered.
CREATE VIEW _host_activity_pieces AS
WITH
  deltas AS (
    SELECT global_pid, ts, sum(delta) AS delta
    FROM (
      SELECT global_pid, start_ns AS ts, (1::HUGEINT << bit) AS delta FROM _host_activity_intervals
      UNION ALL
      SELECT global_pid, end_ns, -(1::HUGEINT << bit) FROM _host_activity_intervals
    )
    GROUP BY ALL
  ),
  pieces AS (
    SELECT
      global_pid,
      ts AS start_ns,
      lead(ts) OVER w AS end_ns,
      sum(delta) OVER (w ROWS UNBOUNDED PRECEDING) AS in_flight
    FROM deltas
    WINDOW w AS (PARTITION BY global_pid ORDER BY ts)
  ),
  won AS (
    SELECT global_pid, start_ns, end_ns, bit_count((in_flight & -in_flight) - 1)::INTEGER AS bit
    FROM pieces
    WHERE in_flight <> 0 AND end_ns IS NOT NULL
  )
SELECT w.global_pid, w.start_ns, w.end_ns, i.global_tid, i.cause_kind, i.cause
FROM won AS w
ASOF JOIN _host_activity_intervals AS i ON i.global_pid = w.global_pid AND i.bit = w.bit AND i.start_ns <= w.start_ns;

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
SELECT global_pid, start_ns, end_ns, global_tid, cause_kind, cause
FROM _host_activity_pieces
ORDER BY global_pid, start_ns;
