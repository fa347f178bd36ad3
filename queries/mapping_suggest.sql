-- Mapping suggestions: the NVTX ranges that could be one iteration, ranked, each with the parameters that map it.
--
-- Notes. Ranges (annotations and Python stack frames alike) are grouped by name (their text with each
-- run of digits as #, so that `execute_context_3(57)_generation_12(12)` and
-- `execute_context_0(0)_generation_15(15)` are one name) and domain. A name is a candidate when it
-- repeats at least 4 times, or when it is a preset's iteration range (a capture of one step has one);
-- on a capture with GPU work, only a name whose ranges launched some of it. For each it measures
-- what an iteration range looks like: its GPU share (the share of its processes' GPU operations
-- launched inside its ranges, through nvtx_gpu_projection; NULL without GPU work), its time share
-- (on each thread, the time inside its ranges over the span from the first one's start to the last
-- one's end, capped at 1), the share of consecutive ranges on one thread that overlap, and how
-- regular its period is (the coefficient of variation of the time from one range's start to the
-- next one's on a thread). The score is coverage (the GPU share where its processes ran GPU work,
-- else the time share) x (1 - overlap share / 2) x 1 / (1 + period cv) x (1 - 1 / ranges): an
-- iteration range launches all of a step's GPU work, follows the one before it, comes at a steady
-- pace and repeats. A preset's iteration range ranks before every other name (the engines' source
-- says it is one), presets in the order auto tries them; the others by score, ties to the larger time
-- share (the range that encloses its phases), then to the shallower nesting depth. `params` maps the
-- candidate: a preset whose iteration range it is, else the generic mapping with a pattern that
-- matches exactly the name's ranges.
--
-- @uses mapping_presets

-- Per range: its name (worked out once per distinct text), thread, times and the GPU work it launched.
CREATE VIEW _mapping_suggest_ranges AS
WITH
  texts AS (SELECT unnest(list(DISTINCT text)) AS text FROM nvtx_ranges),
  names AS (SELECT text, regexp_replace(text, '[0-9]+', '#', 'g') AS name FROM texts WHERE text IS NOT NULL)
SELECT
  n.name,
  r.domain_name,
  coalesce(r.domain_name, '') AS domain_key,
  r.global_tid,
  r.global_pid,
  r.start_ns,
  r.end_ns,
  r.depth,
  coalesce(p.gpu_op_count, 0) AS gpu_ops,
  lead(r.start_ns) OVER w AS next_start_ns
FROM nvtx_ranges AS r
JOIN names AS n ON n.text = r.text
LEFT JOIN nvtx_gpu_projection AS p ON p.range_id = r.range_id
WHERE r.end_ns IS NOT NULL
WINDOW w AS (PARTITION BY n.name, r.domain_name, r.global_tid ORDER BY r.start_ns, r.range_id);

-- The candidates, ranked.
CREATE VIEW mapping_suggest (
  -- Rank, 1 for the range most likely to be one iteration.
  rank,
  -- The ranges' name: their text with each run of digits as #.
  name,
  -- Their NVTX domain; NULL for the default domain.
  domain,
  -- How many ranges have this name (closed ones, on all threads).
  ranges,
  -- Threads they run on.
  threads,
  -- Share of their processes' GPU operations launched inside them (0 to 1); NULL when those processes ran no GPU work.
  gpu_share,
  -- Per thread, the time inside them over the span from the first one's start to the last one's end, over all threads (0 to 1).
  time_share,
  -- Share of consecutive ranges on one thread where the next starts before the one before it ends.
  overlap_share,
  -- Median time from one range's start to the next one's on a thread.
  period_p50_ns,
  -- Standard deviation of that time over its mean; 0 for a steady pace.
  period_cv,
  -- Least nesting depth of its push/pop ranges; NULL for start/end ranges.
  depth,
  -- coverage x (1 - overlap_share / 2) x 1 / (1 + period_cv) x (1 - 1 / ranges), coverage being gpu_share where there is GPU work, else time_share.
  score,
  -- The preset whose iteration range this is (mapping_presets), else NULL.
  preset,
  -- A pattern that matches exactly the ranges of this name (for the generic mapping).
  step_pattern,
  -- The parameters that map it, as itertrace's commands take them: the preset, else the generic mapping with step_pattern (and domain).
  params
) AS
WITH
  per_thread AS (
    SELECT name, domain_key, any_value(domain_name) AS domain_name, global_tid, global_pid, count(*) AS ranges, sum(end_ns - start_ns) AS inside_ns,
           max(end_ns) - min(start_ns) AS span_ns, sum(gpu_ops) AS gpu_ops, min(depth) AS depth,
           count(next_start_ns) AS pairs, count(*) FILTER (WHERE next_start_ns < end_ns) AS overlapping
    FROM _mapping_suggest_ranges
    GROUP BY name, domain_key, global_tid, global_pid
  ),
  periods AS (
    SELECT name, domain_key, quantile_disc(next_start_ns - start_ns, 0.5) AS p50,
           stddev_pop(next_start_ns - start_ns) / nullif(avg(next_start_ns - start_ns), 0) AS cv
    FROM _mapping_suggest_ranges
    WHERE next_start_ns IS NOT NULL
    GROUP BY ALL
  ),
  process_ops AS (SELECT global_pid, count(*) AS gpu_ops FROM gpu_ops GROUP BY ALL),
  names AS (
    SELECT name, domain_key, any_value(domain_name) AS domain_name, sum(ranges) AS ranges, count(*) AS threads, sum(gpu_ops) AS gpu_ops,
           least(1.0, sum(inside_ns) / nullif(sum(span_ns), 0)) AS time_share, min(depth) AS depth,
           sum(overlapping) / nullif(sum(pairs), 0) AS overlap_share,
           list(DISTINCT global_pid) AS pids
    FROM per_thread
    GROUP BY name, domain_key
  ),
  shares AS (
    SELECT n.name, n.domain_key,
           CASE WHEN sum(o.gpu_ops) > 0 THEN least(1.0, any_value(n.gpu_ops) / sum(o.gpu_ops)) END AS gpu_share
    FROM names AS n
    CROSS JOIN unnest(n.pids) AS u(pid)
    LEFT JOIN process_ops AS o ON o.global_pid = u.pid
    GROUP BY ALL
  ),
  presets AS (
    SELECT n.name, n.domain_key, arg_min(p.preset, p.position) AS preset, min(p.position) AS preset_position
    FROM names AS n
    JOIN mapping_presets AS p
      ON regexp_matches(n.name, regexp_replace(p.step_pattern, '\\d', '#', 'g'))
     AND (p.domain IS NULL OR p.domain = n.domain_name)
    GROUP BY ALL
  ),
  scored AS (
    SELECT n.*, s.gpu_share, e.p50, coalesce(e.cv, 0) AS cv, r.preset, r.preset_position,
           coalesce(s.gpu_share, n.time_share, 0) * (1 - coalesce(n.overlap_share, 0) / 2)
             / (1 + coalesce(e.cv, 0)) * (1 - 1 / n.ranges) AS score,
           '^' || replace(regexp_replace(n.name, '([\\.^$|()\[\]{}*+?])', '\\\1', 'g'), '#', '\d+') || '$' AS pattern
    FROM names AS n
    JOIN shares AS s USING (name, domain_key)
    LEFT JOIN periods AS e USING (name, domain_key)
    LEFT JOIN presets AS r USING (name, domain_key)
    WHERE (n.ranges >= 4 OR r.preset IS NOT NULL)
      AND (coalesce(s.gpu_share, 0) > 0 OR NOT EXISTS (SELECT 1 FROM gpu_ops))
  )
SELECT
  row_number() OVER (ORDER BY preset_position NULLS LAST, score DESC, time_share DESC, depth NULLS LAST, name,
                                domain_name),
  name, domain_name, ranges::BIGINT, threads, gpu_share::DOUBLE, time_share::DOUBLE, overlap_share::DOUBLE, p50,
  cv::DOUBLE, depth, score::DOUBLE, preset, pattern,
  CASE WHEN preset IS NOT NULL THEN '--param preset=' || preset
    ELSE '--param preset=generic --param step_pattern=''' || pattern || ''''
         || CASE WHEN domain_name IS NOT NULL THEN ' --param domain=''' || domain_name || '''' ELSE '' END END
FROM scored
ORDER BY 1;
