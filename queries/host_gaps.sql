-- Host gaps: the device's idle time between consecutive iterations, and the host work that filled it.
--
-- Notes. On each track (the thread that runs the step ranges) iterations are taken in order of
-- their device start. A gap runs from the latest device end so far to the next device start; when
-- the next iteration's device work starts before that (overlapping device work), the gap is 0. So
-- a track's gaps never overlap one another. A gap is split among the host-phase ranges that overlap
-- it: leaf push/pop ranges on the track's thread that match the phase pattern, a leaf being one
-- that holds no other such range (ranges of other names or domains inside it, such as a library's
-- own, leave it a leaf). Leaves on one thread never overlap (push/pop ranges nest), so the parts of
-- a gap never count an instant twice, and what no leaf covers is the `unattributed` part: the parts
-- of a gap always add up to the gap. Start/end ranges, which may overlap, take no part; a leaf
-- still open when the capture stopped covers everything after its start.
--
-- How the parts are computed (in one sort of the ranges and gaps, not per-row joins): the phase
-- ranges and the gaps of a track are sorted together by start (at one instant a gap before a range,
-- ranges longest first) and walked once with running `last_value` windows, which carry along the walk
-- the latest gap and the latest phase range seen. Gaps are disjoint, and so are leaves, so a leaf and
-- a gap overlap exactly when the leaf starts inside the gap (then the gap is the latest one started
-- at or before the leaf) or the gap starts inside the leaf (then the leaf is the latest phase range
-- started before the gap: were that range not a leaf, the next range starts inside it after the
-- gap's start, and no earlier leaf reaches the gap). Whether a range is a leaf is seen at the next
-- phase range of the walk (it is not a leaf if that one starts before it ends), after its pairs
-- were found, so the pairs of non-leaves are dropped afterwards. The parts are then sorted by
-- (track, gap, phase) and walked again to add up the time of each phase in each gap, and the gap's
-- unattributed rest. Gaps are keyed by their place on the track (gap_seq), not by iteration: an
-- iteration may be NULL, for a step the mapping cannot number. host_gaps_parts lists the gaps in
-- host_gaps' order, each gap's parts by phase name with `unattributed` last.
--
-- @param limit BIGINT How many gaps host_gaps_worst lists; 10 when not given.

-- The gaps, in no particular order (host_gaps sorts them). gap_seq, the gap's place on its track,
-- is the key the views below join gaps on: an iteration may be NULL (a step the mapping cannot number).
CREATE VIEW _host_gaps_unordered AS
WITH
  device AS (
    SELECT global_tid, iteration, device_start_ns, device_end_ns
    FROM _iterations_device
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
  prev_iteration,
  iteration,
  least(busy_until_ns, device_start_ns) AS gap_start_ns,
  device_start_ns AS gap_end_ns,
  greatest(device_start_ns - busy_until_ns, 0) AS gap_ns,
  gap_seq
FROM ordered
WHERE busy_until_ns IS NOT NULL;

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
  -- gap_end_ns - gap_start_ns: time the device did no work of this track; 0 when device work overlapped.
  gap_ns
) AS
SELECT global_tid, prev_iteration, iteration, gap_start_ns, gap_end_ns, gap_ns
FROM _host_gaps_unordered
ORDER BY global_tid, gap_end_ns, iteration;

-- The host phases: each distinct range text that matches the phase pattern, its phase name, and the
-- phase's place in the order of host_gaps_parts (by name, `unattributed` last). The pattern and name
-- are worked out once per distinct text, not once per range (a trace holds millions of ranges but
-- few names); the texts go through a list so that the pattern is not pushed down to every range.
CREATE VIEW _host_gaps_phase_names AS
WITH
  texts AS (SELECT unnest(list(DISTINCT text)) AS text FROM nvtx_ranges),
  names AS (
    SELECT text, mapping_phase_name(text) AS phase
    FROM texts
    WHERE regexp_matches(text, mapping_phase_pattern())
  )
SELECT text, phase, dense_rank() OVER (ORDER BY phase = 'unattributed', phase)::INTEGER AS phase_rank
FROM names;

-- Every (gap, leaf) overlap, with its length (the walk described at the top of this file).
CREATE VIEW _host_gaps_overlaps AS
WITH
  gaps AS (
    SELECT global_tid, iteration, gap_seq, gap_start_ns, gap_end_ns FROM _host_gaps_unordered WHERE gap_ns > 0
  ),
  events AS (
    -- One opening row per track, first on it: as its latest gap and latest phase range it carries
    -- ends at the smallest time, so nothing pairs with what came before on another track.
    SELECT DISTINCT
      global_tid,
      -9223372036854775808 AS start_ns,
      -9223372036854775808 AS end_ns,
      NULL::BIGINT AS range_id,
      NULL::INTEGER AS phase_rank,
      {'iteration': NULL::BIGINT} AS gap_iteration,
      NULL::BIGINT AS gap_seq,
      -9223372036854775808 AS gap_end_ns
    FROM gaps
    UNION ALL
    -- The gaps (end_ns NULL: at one instant a gap comes before the ranges). The iteration is boxed
    -- in a struct so that a NULL iteration is still carried by last_value(... IGNORE NULLS).
    SELECT global_tid, gap_start_ns, NULL, NULL, NULL, {'iteration': iteration}, gap_seq, gap_end_ns
    FROM gaps
    UNION ALL
    -- The push/pop phase ranges of the tracks; one still open when the capture stopped ends last.
    SELECT r.global_tid, r.start_ns, coalesce(r.end_ns, 9223372036854775807), r.range_id, n.phase_rank, NULL, NULL, NULL
    FROM nvtx_ranges AS r
    JOIN _host_gaps_phase_names AS n ON n.text = r.text
    WHERE r.range_kind = 'push_pop'
      AND (mapping_domain() IS NULL OR r.domain_name = mapping_domain())
      AND r.global_tid IN (SELECT global_tid FROM gaps)
  ),
  ordered AS (
    SELECT * FROM events ORDER BY global_tid, start_ns, end_ns DESC NULLS FIRST, range_id
  ),
  walk AS (
    -- The latest gap and the latest phase range so far, at every row of the walk. Windows with an
    -- empty OVER run in the order of their input (DuckDB keeps it), here the sort above.
    SELECT
      *,
      last_value(gap_end_ns IGNORE NULLS) OVER so_far AS last_gap_end_ns,
      last_value(gap_iteration IGNORE NULLS) OVER so_far AS last_gap_iteration,
      last_value(gap_seq IGNORE NULLS) OVER so_far AS last_gap_seq,
      last_value(end_ns IGNORE NULLS) OVER so_far AS last_end_ns,
      last_value(range_id IGNORE NULLS) OVER so_far AS last_range_id,
      last_value(phase_rank IGNORE NULLS) OVER so_far AS last_phase_rank
    FROM ordered
    WINDOW so_far AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
  ),
  found AS MATERIALIZED (
    -- At a range: the pair with the latest gap if the range starts inside it, and whether the range
    -- before it on the walk is no leaf (this one starts before that one ends). At a gap: the pair
    -- with the latest range if the gap starts inside it.
    SELECT
      global_tid,
      CASE WHEN range_id IS NOT NULL THEN last_gap_iteration ELSE gap_iteration END.iteration AS iteration,
      CASE WHEN range_id IS NOT NULL THEN last_gap_seq ELSE gap_seq END AS gap_seq,
      last_range_id AS range_id,
      last_phase_rank AS phase_rank,
      -- (computed only for pairs: the opening rows' smallest time must not enter a subtraction)
      CASE WHEN range_id IS NOT NULL AND start_ns < last_gap_end_ns THEN least(end_ns, last_gap_end_ns) - start_ns
           WHEN range_id IS NULL AND start_ns < last_end_ns THEN least(last_end_ns, gap_end_ns) - start_ns
      END AS overlap_ns,
      CASE WHEN range_id IS NOT NULL THEN start_ns < last_gap_end_ns ELSE start_ns < last_end_ns END AS is_pair,
      CASE WHEN range_id IS NOT NULL AND start_ns < before_end_ns THEN before_range_id END AS not_leaf_id
    FROM (
      SELECT *, lag(last_end_ns) OVER () AS before_end_ns, lag(last_range_id) OVER () AS before_range_id
      FROM walk
    )
    WHERE (CASE WHEN range_id IS NOT NULL THEN start_ns < last_gap_end_ns ELSE start_ns < last_end_ns END)
       OR (range_id IS NOT NULL AND start_ns < before_end_ns)
  )
SELECT global_tid, iteration, gap_seq, phase_rank, overlap_ns
FROM found
WHERE is_pair
  AND range_id NOT IN (SELECT not_leaf_id FROM found WHERE not_leaf_id IS NOT NULL);

-- host_gaps_parts, with each gap's gap_seq (the key the summaries below join gaps on).
CREATE VIEW _host_gaps_parts_keyed AS
WITH
  parts AS (
    -- The overlaps, and each gap as its unattributed part (phase_rank after every phase's).
    SELECT global_tid, iteration, gap_seq, phase_rank, overlap_ns AS attributed_ns, NULL::BIGINT AS gap_ns
    FROM _host_gaps_overlaps
    UNION ALL
    SELECT global_tid, iteration, gap_seq, 2147483647, 0, gap_ns
    FROM _host_gaps_unordered
  ),
  named AS (
    SELECT p.*, coalesce(n.phase, 'unattributed') AS phase
    FROM parts AS p
    LEFT JOIN (SELECT DISTINCT phase, phase_rank FROM _host_gaps_phase_names) AS n ON n.phase_rank = p.phase_rank
  ),
  ordered AS (
    SELECT * FROM named ORDER BY global_tid, gap_seq, phase_rank
  ),
  walk AS (
    -- A running total of the attributed time; where the gap (track, gap_seq) or the phase changes.
    SELECT
      *,
      sum(attributed_ns) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total_ns,
      global_tid IS DISTINCT FROM lag(global_tid) OVER () OR gap_seq IS DISTINCT FROM lag(gap_seq) OVER ()
        AS first_of_gap,
      phase_rank IS DISTINCT FROM lag(phase_rank) OVER () AS phase_changed,
      global_tid IS DISTINCT FROM lead(global_tid) OVER () OR gap_seq IS DISTINCT FROM lead(gap_seq) OVER ()
        OR phase_rank IS DISTINCT FROM lead(phase_rank) OVER () AS last_of_phase
    FROM ordered
  ),
  totals AS (
    -- The running total before the first row of this phase in this gap, and before the gap's first row.
    SELECT
      *,
      last_value(CASE WHEN first_of_gap OR phase_changed THEN total_ns - attributed_ns END IGNORE NULLS)
        OVER so_far AS phase_before_ns,
      last_value(CASE WHEN first_of_gap THEN total_ns - attributed_ns END IGNORE NULLS)
        OVER so_far AS gap_before_ns
    FROM walk
    WINDOW so_far AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
  )
-- A phase's time in a gap at its last row; the unattributed part at the gap's own row. Rows keep
-- the order of the sort above.
SELECT
  global_tid,
  iteration,
  gap_seq,
  phase,
  (CASE WHEN gap_ns IS NOT NULL THEN gap_ns - (total_ns - gap_before_ns)
        ELSE total_ns - phase_before_ns END)::BIGINT AS dur_ns
FROM totals
WHERE gap_ns IS NOT NULL OR last_of_phase;

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
