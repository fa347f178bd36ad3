-- Host gaps: the device's idle time between consecutive iterations, and the host work that filled it.
--
-- Notes. On each track (the thread that runs the step ranges) iterations are taken in order of
-- their device start. A gap runs from the latest device end so far to the next device start; when
-- the next iteration's device work starts before that (overlapping device work), the gap is empty.
-- So a track's gaps never overlap one another. Of a gap, only the time in which the process runs no
-- GPU work at all, on any device and stream, is idle: GPU work launched outside the step ranges (a
-- sampler launched after the step's range ends, a copy on a stream of its own) keeps the device busy,
-- and that time is no host gap. gap_ns is that idle time, the same idle time gpu_time.sql counts
-- (one definition of idle): the idle pieces of a gap are gpu_time's idle spans cut to the gap, so
-- with one track per process the gaps add up to exactly gpu_time's idle time between iterations.
-- The idle pieces of a gap are split among the host-phase ranges that overlap them: leaf push/pop
-- ranges (or stack frames) on the track's thread that match the phase pattern, a leaf being one
-- that holds no other such range (ranges of other names or domains inside it, such as a library's
-- own, leave it a leaf). Leaves on one thread never overlap (push/pop ranges nest), so the parts of
-- a gap never count an instant twice, and what no leaf covers is the `unattributed` part: the parts
-- of a gap always add up to the gap. Start/end ranges, which may overlap, take no part; a leaf
-- still open when the capture stopped covers everything after its start. A range whose phase name
-- would be `unattributed` is no phase: its time stays in the gap's one unattributed part.
--
-- How the parts are computed (with joins that DuckDB runs on all cores, not per-row joins): the idle
-- pieces of a track's gaps are disjoint, and so are leaves, so a leaf and a piece overlap exactly when
-- the leaf starts inside the piece (then the piece is the latest one started at or before the leaf) or
-- the piece starts inside the leaf (then the leaf is the latest one started before the piece). Each
-- case is one ASOF join; the gaps are cut into idle pieces the same way, against the complement of the
-- union of the process's GPU work (intervals.sql does each of these). A phase range is a leaf when the
-- phase range that comes next on its thread (by start, longest first) does not start before it ends:
-- push/pop ranges nest, so the next one lies inside it exactly when it starts before it ends
-- (intervals_leaves). The overlaps are added up by (track, gap, phase), and each gap's unattributed
-- part is the gap less what its phases took. Gaps are keyed by their place on the track (gap_seq), not
-- by iteration: an iteration may be NULL, for a step the mapping cannot number. host_gaps_parts lists
-- the gaps in host_gaps' order, each gap's parts by phase name with `unattributed` last.
--
-- @param limit BIGINT (>=0) How many gaps host_gaps_worst lists; 10 when not given.
--
-- @uses intervals, iterations, mapping

-- The gaps' bounds, in no particular order: from the latest device end on the track to the next
-- device start. gap_seq, the gap's place on its track, is the key the views below join gaps on: an
-- iteration may be NULL (a step the mapping cannot number).
CREATE VIEW _host_gaps_bounds AS
WITH
  device AS (
    SELECT global_tid, global_pid, iteration, device_start_ns, device_end_ns
    FROM iterations_device
    WHERE device_start_ns IS NOT NULL
  ),
  ordered AS (
    SELECT
      *,
      arg_max(iteration, device_end_ns) OVER before AS prev_iteration,
      max(device_end_ns) OVER before AS busy_until_ns,
      count(*) OVER before AS gap_seq  -- device intervals before this one: one window with the two above
    FROM device
    WINDOW before AS (PARTITION BY global_tid ORDER BY device_start_ns, iteration
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
  )
SELECT
  global_tid,
  global_pid,
  prev_iteration,
  iteration,
  least(busy_until_ns, device_start_ns) AS gap_start_ns,
  device_start_ns AS gap_end_ns,
  gap_seq
FROM ordered
WHERE busy_until_ns IS NOT NULL;

-- The idle pieces of each gap: the gap less the union of its process's GPU work, disjoint per track.
CREATE VIEW _host_gaps_idle AS
WITH
  gaps AS MATERIALIZED (
    SELECT global_tid AS key, global_pid, gap_seq, gap_start_ns AS start_ns, gap_end_ns AS end_ns
    FROM _host_gaps_bounds
    WHERE gap_end_ns > gap_start_ns
  ),
  -- the time a process's GPU work keeps some device busy: its operations on every device and stream
  ops AS (SELECT global_pid AS key, start_ns, end_ns FROM gpu_ops),
  idle AS MATERIALIZED (SELECT * FROM intervals_complement(ops, -9223372036854775808, 9223372036854775807)),
  spans AS MATERIALIZED (
    -- each process's idle spans once per track of it (a process without GPU work is idle throughout)
    SELECT t.key, coalesce(i.start_ns, -9223372036854775808) AS start_ns,
           coalesce(i.end_ns, 9223372036854775807) AS end_ns
    FROM (SELECT DISTINCT key, global_pid FROM gaps) AS t
    LEFT JOIN idle AS i ON i.key = t.global_pid
  ),
  pieces AS (SELECT key, gap_seq, start_ns, end_ns FROM gaps)
SELECT key AS global_tid, gap_seq, start_ns, end_ns
FROM intervals_intersect(pieces, spans);

-- The gaps, in no particular order (host_gaps sorts them), each with its idle time.
CREATE VIEW _host_gaps_unordered AS
WITH idle AS (SELECT global_tid, gap_seq, sum(end_ns - start_ns) AS idle_ns FROM _host_gaps_idle GROUP BY ALL)
SELECT b.global_tid, b.prev_iteration, b.iteration, b.gap_start_ns, b.gap_end_ns,
       coalesce(i.idle_ns, 0)::BIGINT AS gap_ns, b.gap_seq
FROM _host_gaps_bounds AS b
LEFT JOIN idle AS i USING (global_tid, gap_seq);

-- One row per pair of consecutive device intervals on a track.
CREATE VIEW host_gaps (
  -- The track: global id of the thread that ran the step ranges.
  global_tid,
  -- The iteration before the gap: the one whose device work ended last before it.
  prev_iteration,
  -- The iteration after the gap: its device work ends the gap.
  iteration,
  -- Start of the gap: the latest device end on the track so far (ns since the capture started).
  gap_start_ns,
  -- End of the gap: the device start of `iteration`.
  gap_end_ns,
  -- Time in the gap in which the process ran no GPU work at all (on any device and stream): its idle time; 0 when device work overlapped.
  gap_ns
) AS
SELECT global_tid, prev_iteration, iteration, gap_start_ns, gap_end_ns, gap_ns
FROM _host_gaps_unordered
ORDER BY global_tid, gap_end_ns, iteration;

-- The host phases: each distinct range text that matches the phase pattern, its phase name, and the
-- phase's place in the order of host_gaps_parts (by name; `unattributed` comes after all). The pattern and name
-- are worked out once per distinct text, not once per range (a trace holds millions of ranges but
-- few names); the texts go through a list so that the pattern is not pushed down to every range.
CREATE VIEW host_gaps_phase_names (
  -- A range text (nvtx_ranges.text) that matches the phase pattern.
  text,
  -- Its phase name, as host_gaps_parts names it.
  phase,
  -- The phase's place in the order of host_gaps_parts, 1 first (by name).
  phase_rank
) AS
WITH
  texts AS (SELECT unnest(list(DISTINCT text)) AS text FROM nvtx_ranges),
  names AS (
    SELECT text, mapping_phase_name(text) AS phase
    FROM texts
    WHERE regexp_matches(text, mapping_phase_pattern())
  )
SELECT text, phase, dense_rank() OVER (ORDER BY phase)::INTEGER AS phase_rank
FROM names
WHERE phase <> 'unattributed';

-- The ranges of the host phases, on every thread: push/pop ranges (or stack frames) whose text is a
-- phase's (host_gaps_phase_names), in the mapping's domain; start/end ranges, which may overlap, take
-- no part, nor frames unless the mapping has a phase pattern (host_activity reads them too).
CREATE VIEW host_gaps_phase_ranges (
  -- The range (nvtx_ranges.range_id).
  range_id,
  -- Its process (nvtx_ranges.global_pid).
  global_pid,
  -- Its thread (nvtx_ranges.global_tid).
  global_tid,
  -- When it starts.
  start_ns,
  -- When it ends; NULL for a range still open when the capture stopped.
  end_ns,
  -- Its phase (host_gaps_phase_names.phase_rank).
  phase_rank
) AS
SELECT r.range_id, r.global_pid, r.global_tid, r.start_ns, r.end_ns, n.phase_rank
FROM nvtx_ranges AS r
JOIN host_gaps_phase_names AS n ON n.text = r.text
WHERE r.range_kind <> 'start_end' AND (r.range_kind <> 'python_frame' OR mapping_phase_pattern() <> '')
  AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain());

-- The host-phase leaves of the tracks' threads, those with device work (see the notes at the top of
-- host_gaps.sql; what_if_overlap reads them too); a leaf still open when the capture stopped ends last.
CREATE VIEW host_gaps_leaves (
  -- The thread (nvtx_ranges.global_tid), one with device work.
  global_tid,
  -- When the leaf starts.
  start_ns,
  -- When it ends; the largest BIGINT for a leaf still open when the capture stopped.
  end_ns,
  -- Its phase (host_gaps_phase_names.phase_rank).
  phase_rank
) AS
WITH
  phases AS (
    SELECT global_tid AS key, range_id AS id, start_ns, end_ns, phase_rank
    FROM host_gaps_phase_ranges
    WHERE global_tid IN (SELECT global_tid FROM iterations_device WHERE device_start_ns IS NOT NULL)
  )
SELECT key AS global_tid, start_ns, coalesce(end_ns, 9223372036854775807) AS end_ns, phase_rank
FROM intervals_leaves(phases);

-- Every (idle piece of a gap, leaf) overlap, with its length: a leaf starting inside a piece, or a
-- piece starting inside a leaf (at one instant, the leaf counts as starting inside the piece).
CREATE VIEW _host_gaps_overlaps AS
WITH
  leaves AS (SELECT global_tid AS key, start_ns, end_ns, phase_rank FROM host_gaps_leaves),
  pieces AS (
    SELECT i.global_tid AS key, b.iteration, i.gap_seq, i.start_ns, i.end_ns
    FROM _host_gaps_idle AS i
    JOIN _host_gaps_bounds AS b USING (global_tid, gap_seq)
    WHERE i.end_ns > i.start_ns
  )
SELECT key AS global_tid, iteration, gap_seq, phase_rank, end_ns - start_ns AS overlap_ns
FROM intervals_intersect(leaves, pieces);

-- host_gaps_parts, with each gap's gap_seq (the key the summaries below join gaps on).
CREATE VIEW _host_gaps_parts_keyed AS
WITH
  attributed AS (
    SELECT global_tid, gap_seq, any_value(iteration) AS iteration, phase_rank, sum(overlap_ns)::BIGINT AS dur_ns
    FROM _host_gaps_overlaps
    GROUP BY global_tid, gap_seq, phase_rank
  ),
  covered AS (
    SELECT global_tid, gap_seq, sum(dur_ns) AS dur_ns FROM attributed GROUP BY global_tid, gap_seq
  ),
  parts AS (
    SELECT a.global_tid, a.iteration, a.gap_seq, a.phase_rank, n.phase, a.dur_ns
    FROM attributed AS a
    JOIN (SELECT DISTINCT phase, phase_rank FROM host_gaps_phase_names) AS n ON n.phase_rank = a.phase_rank
    UNION ALL
    -- each gap's unattributed part, after every phase's (rank 2147483647)
    SELECT g.global_tid, g.iteration, g.gap_seq, 2147483647, 'unattributed', (g.gap_ns - coalesce(c.dur_ns, 0))::BIGINT
    FROM _host_gaps_unordered AS g
    LEFT JOIN covered AS c ON c.global_tid = g.global_tid AND c.gap_seq = g.gap_seq
  )
SELECT global_tid, iteration, gap_seq, phase, dur_ns
FROM parts
ORDER BY global_tid, gap_seq, phase_rank;

-- Each gap split into host phases and an `unattributed` remainder; a gap's parts add up to its gap_ns.
CREATE VIEW host_gaps_parts (
  -- The track (host_gaps.global_tid).
  global_tid,
  -- The iteration after the gap (host_gaps.iteration).
  iteration,
  -- Host phase (mapping_phase_name of the leaf ranges), or 'unattributed' for time no leaf covers.
  phase,
  -- Time of the gap spent in this phase; every gap has an unattributed row, possibly 0.
  dur_ns
) AS
SELECT global_tid, iteration, phase, dur_ns FROM _host_gaps_parts_keyed;

-- Per host phase, its time in gaps: totals and distribution over all gaps (0 where a gap has none of it).
CREATE VIEW host_gaps_by_phase (
  -- Host phase, or 'unattributed'.
  phase,
  -- Gaps (all tracks).
  gaps,
  -- Gaps with some time in this phase.
  gaps_with_phase,
  -- Time of all gaps spent in this phase.
  total_ns,
  -- total_ns as a share of all gap time (0 to 1); NULL when there is no gap time.
  share,
  -- Mean time per gap in this phase.
  mean_ns,
  -- Median over gaps of the time in this phase.
  p50_ns,
  -- 90th percentile over gaps (nearest rank).
  p90_ns,
  -- 99th percentile over gaps (nearest rank).
  p99_ns,
  -- Most time of one gap in this phase.
  max_ns
) AS
WITH
  parts AS (SELECT * FROM _host_gaps_parts_keyed),
  phases AS (SELECT DISTINCT phase FROM parts),
  grid AS (
    SELECT p.phase, coalesce(x.dur_ns, 0) AS dur_ns
    FROM phases AS p
    CROSS JOIN _host_gaps_unordered AS g
    LEFT JOIN parts AS x ON x.phase = p.phase AND x.global_tid = g.global_tid AND x.gap_seq = g.gap_seq
  ),
  all_gaps AS (SELECT sum(gap_ns) AS total_ns FROM host_gaps)
SELECT
  phase,
  count(*),
  count(*) FILTER (WHERE dur_ns > 0),
  sum(dur_ns)::BIGINT,
  sum(dur_ns) / nullif((SELECT total_ns FROM all_gaps), 0),
  avg(dur_ns),
  quantile_disc(dur_ns, 0.5),
  quantile_disc(dur_ns, 0.9),
  quantile_disc(dur_ns, 0.99),
  max(dur_ns)
FROM grid
GROUP BY phase
ORDER BY phase = 'unattributed', sum(dur_ns) DESC, phase;

-- Per track: how much of its wall time the device sat in gaps, and the gaps' distribution.
CREATE VIEW host_gaps_summary (
  -- The track (host_gaps.global_tid).
  global_tid,
  -- Iterations with a device interval on the track.
  iterations,
  -- Gaps: iterations - 1.
  gaps,
  -- From the first device start to the last device end on the track.
  wall_ns,
  -- Sum of the gaps.
  gap_total_ns,
  -- gap_total_ns / wall_ns: the share of the track's wall time with its device idle between iterations.
  gap_share,
  -- Median gap.
  gap_p50_ns,
  -- 90th percentile gap (nearest rank).
  gap_p90_ns,
  -- 99th percentile gap (nearest rank).
  gap_p99_ns,
  -- Longest gap.
  gap_max_ns,
  -- Median launch latency over GPU iterations (iterations.launch_latency_ns); NULL without GPU work.
  launch_latency_p50_ns
) AS
WITH
  device AS (
    SELECT
      global_tid,
      count(*) AS iterations,
      max(device_end_ns) - min(device_start_ns) AS wall_ns,
      quantile_disc(launch_latency_ns, 0.5) AS launch_latency_p50_ns
    FROM iterations
    WHERE device_start_ns IS NOT NULL
    GROUP BY global_tid
  ),
  gaps AS (
    SELECT
      global_tid,
      count(*) AS gaps,
      sum(gap_ns)::BIGINT AS total_ns,
      quantile_disc(gap_ns, 0.5) AS p50,
      quantile_disc(gap_ns, 0.9) AS p90,
      quantile_disc(gap_ns, 0.99) AS p99,
      max(gap_ns) AS max_ns
    FROM host_gaps
    GROUP BY global_tid
  )
SELECT
  d.global_tid,
  d.iterations,
  coalesce(g.gaps, 0),
  d.wall_ns,
  coalesce(g.total_ns, 0),
  coalesce(g.total_ns, 0) / nullif(d.wall_ns, 0),
  g.p50,
  g.p90,
  g.p99,
  g.max_ns,
  d.launch_latency_p50_ns
FROM device AS d
LEFT JOIN gaps AS g ON g.global_tid = d.global_tid
ORDER BY d.global_tid;

-- The longest gaps, with the iterations around them and the phase that took most of each.
CREATE VIEW host_gaps_worst (
  -- Rank, 1 for the longest gap (ties broken by track, then iteration).
  rank,
  -- The track (host_gaps.global_tid).
  global_tid,
  -- The iteration before the gap.
  prev_iteration,
  -- The iteration after the gap.
  iteration,
  -- Length of the gap.
  gap_ns,
  -- The part (host phase or unattributed) that took most of the gap.
  top_phase,
  -- Time of the gap in top_phase.
  top_phase_ns
) AS
WITH
  ranked AS (
    SELECT *, row_number() OVER (ORDER BY gap_ns DESC, global_tid, iteration, gap_seq) AS rank
    FROM _host_gaps_unordered
  ),
  worst AS (
    SELECT * FROM ranked WHERE rank <= coalesce(getvariable('limit')::BIGINT, 10)
  ),
  top_part AS (
    -- The longest part of each of those gaps; of parts equally long, the first by name.
    SELECT p.global_tid, p.gap_seq, p.phase, p.dur_ns
    FROM _host_gaps_parts_keyed AS p
    SEMI JOIN worst AS w ON w.global_tid = p.global_tid AND w.gap_seq = p.gap_seq
    QUALIFY row_number() OVER (PARTITION BY p.global_tid, p.gap_seq ORDER BY p.dur_ns DESC, p.phase) = 1
  )
SELECT w.rank, w.global_tid, w.prev_iteration, w.iteration, w.gap_ns, t.phase, t.dur_ns
FROM worst AS w
JOIN top_part AS t ON t.global_tid = w.global_tid AND t.gap_seq = w.gap_seq
ORDER BY w.rank;
