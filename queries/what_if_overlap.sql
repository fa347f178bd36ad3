-- What overlap would buy: from a capture of a run without overlap, the iteration times, throughput and
-- TPOT that hiding chosen host phases behind the device would give.
--
-- The model. On each track (the thread that runs the step ranges) the iterations with a device
-- interval are taken in order of their step ranges. Iteration N's time is its period: from the end
-- of the step before it to the end of its own step (the end of a step is when its tokens exist), so
-- the periods of a run of iterations tile it. A period holds N's device time (its device interval,
-- clipped to the period) and N's host time (the rest: its host phases, time no phase covers, the
-- time between the steps). N's hidden work is the time of the phases named in `hide` in its host
-- time: the leaf push/pop ranges on the track's thread that match the mapping's phase pattern, as
-- host_gaps_parts counts them, less any part inside N's device interval. What is hidden of N+1 runs
-- while N's device works, so
--
--     predicted(N) = max(device(N), hidden(N+1)) + exposed(N),   exposed(N) = host(N) - hidden(N)
--
-- and the predicted end of N is the predicted start of its run plus the predicted times of the run's
-- iterations up to N. A run of iterations starts at the first iteration on the track and after an
-- idle stretch (a step without device work: nothing was runnable, so the engine waited): its first
-- iteration has no device interval before it to hide behind, so all of its host time is exposed
-- (exposed = host), and its predicted start is its measured step start: the work it waited for comes
-- when it came, however early the run before ends. The last iteration of a run has nothing hidden
-- behind it (hidden(N+1) = 0).
-- With nothing hidden, every predicted time and end is the measured one, exactly.
--
-- What the model leaves as it was: which requests run in which iteration (the schedule), every
-- device interval, every exposed host time, and the idle stretches. A hidden phase moves behind the
-- previous device interval whether it ran before or after its own device work in the capture:
-- schedule and prepare (this engine's phases that do not need the sampled token, the default) can
-- really run one step ahead; naming sample, detokenize or postprocess predicts what an engine that
-- could run them ahead too would get. The time between steps counts as exposed host time of the
-- iteration after it: a wait there that no idle step marks (this engine, holding no request, sleeps
-- between steps until the next arrival) is kept at its measured length, so the iterations after it
-- start as early as the prediction lets them, before their requests arrived: on a workload that
-- empties the engine, predicted throughput is too high by at most the savings before each such wait
-- (TPOT is not affected: in this engine no request spans one). Tokens and TPOT come from the trace alone (the
-- `tokens` marks, as request_latency_trace_tokens reads them), each token at the predicted end of
-- the iteration that sampled it.
--
-- @param hide VARCHAR Host phases to hide behind the device: phase names as host_gaps_parts names them, comma-separated; schedule,prepare when not given; empty for none.
--
-- @uses host_gaps, intervals, iterations, request_latency

-- The phases to hide: the `hide` parameter as a list of names, blanks and repeats dropped.
CREATE MACRO _what_if_overlap_hide() AS list_distinct(list_filter(
  list_transform(string_split(coalesce(getvariable('hide'), 'schedule,prepare'), ','), lambda name: trim(name)),
  lambda name: name <> ''));

-- The phases to hide, each one a phase of this trace; a name that is none fails the query with a message.
CREATE VIEW _what_if_overlap_hidden_phases AS
WITH
  asked AS (SELECT unnest(_what_if_overlap_hide()) AS phase),
  known AS (SELECT DISTINCT phase FROM host_gaps_phase_names),
  listed AS (
    SELECT coalesce(nullif(array_to_string(list_slice(list(phase ORDER BY phase), 1, 12), ', ')
                           || CASE WHEN count(*) > 12 THEN ', ...' ELSE '' END, ''), 'none') AS phases
    FROM known
  )
SELECT CASE WHEN a.phase IN (SELECT phase FROM known) THEN a.phase ELSE error(
  'parameter hide: this trace has no host phase named ''' || a.phase || ''' (its phases: ' || l.phases || ')'
  || CASE WHEN getvariable('hide') IS NULL THEN '; hide is schedule,prepare when not given' ELSE '' END
  || '; give the phases to hide as --param hide=NAME,NAME') END AS phase
FROM asked AS a, listed AS l;

-- Per iteration with a device interval and a closed step range: its period, its device interval clipped
-- to the period, whether it starts a run, and which run (0, 1, ... on its track).
CREATE VIEW _what_if_overlap_periods AS
WITH
  steps AS (
    SELECT
      global_tid,
      iteration,
      step_range_id,
      host_start_ns,
      host_end_ns,
      device_start_ns,
      device_end_ns,
      lag(host_end_ns) OVER track AS prev_end_ns,
      lag(device_start_ns) OVER track IS NULL AS first_in_run  -- first on the track, or after a step without device work
    FROM iterations
    WHERE host_end_ns IS NOT NULL
    WINDOW track AS (PARTITION BY global_tid ORDER BY host_start_ns, step_range_id)
  ),
  busy AS (
    SELECT *, CASE WHEN first_in_run THEN host_start_ns ELSE prev_end_ns END AS period_start_ns
    FROM steps
    WHERE device_start_ns IS NOT NULL
  )
SELECT
  *,
  greatest(device_start_ns, period_start_ns) AS device_from_ns,
  least(device_end_ns, host_end_ns) AS device_to_ns,
  sum(first_in_run::INTEGER) OVER (PARTITION BY global_tid ORDER BY host_start_ns, step_range_id) - 1 AS run
FROM busy;

-- The leaves on the tracks' threads (host_gaps_parts's phase leaves: push/pop phase ranges that hold
-- no other phase range; one still open when the capture stopped ends last) whose phase is hidden.
CREATE VIEW _what_if_overlap_hidden_leaves AS
SELECT l.global_tid, l.start_ns, l.end_ns
FROM host_gaps_leaves AS l
WHERE l.phase_rank IN (
  SELECT phase_rank FROM host_gaps_phase_names WHERE phase IN (SELECT phase FROM _what_if_overlap_hidden_phases));

-- Per period, the time of its hidden leaves outside its device interval: the overlaps of the leaves and
-- the periods (both disjoint on a track; intervals.sql), less what of each lies in the device interval.
CREATE VIEW _what_if_overlap_hidden AS
WITH
  periods AS (
    SELECT global_tid AS key, step_range_id, period_start_ns AS start_ns, host_end_ns AS end_ns, device_from_ns,
           device_to_ns
    FROM _what_if_overlap_periods
    WHERE host_end_ns > period_start_ns
  ),
  leaves AS (SELECT global_tid AS key, start_ns, end_ns FROM _what_if_overlap_hidden_leaves)
SELECT
  key AS global_tid,
  step_range_id,
  sum(end_ns - start_ns - greatest(0, least(end_ns, device_to_ns) - greatest(start_ns, device_from_ns)))::BIGINT
    AS hidden_ns
FROM intervals_intersect(leaves, periods)
GROUP BY ALL;

-- Per iteration with a device interval: its measured time, and the time predicted if each iteration's `hide` phases ran while the one before it works on the device: max(device_ns, hidden_next_ns) + exposed_ns. The model in full, with the first iteration and idle stretches: the comment at the top of queries/what_if_overlap.sql.
CREATE VIEW what_if_overlap (
  -- The track (iterations.global_tid).
  global_tid,
  -- Iteration.
  iteration,
  -- True for the first iteration on the track or after an idle stretch (a step without device work): its hidden phases have no device interval to run behind.
  first_in_run,
  -- Measured: from the end of the step before it (its own step start when first_in_run) to the end of its step.
  iteration_ns,
  -- Its device interval, within iteration_ns.
  device_ns,
  -- iteration_ns - device_ns: host phases, time no phase covers, and time between the steps.
  host_ns,
  -- Time of the hidden phases (parameter hide) in host_ns.
  hidden_ns,
  -- hidden_ns of the next iteration, run while this one's device works; 0 when the next one starts a run or there is none.
  hidden_next_ns,
  -- Host time that stays on the critical path: host_ns - hidden_ns, or all of host_ns when first_in_run.
  exposed_ns,
  -- max(device_ns, hidden_next_ns) + exposed_ns.
  predicted_ns,
  -- Measured end of the step: when its tokens exist (ns since the capture started).
  end_ns,
  -- Predicted end: the run's first step start plus predicted_ns of the run's iterations up to this one.
  predicted_end_ns
) AS
WITH
  own AS (
    SELECT
      p.*,
      p.host_end_ns - p.period_start_ns AS iteration_ns,
      greatest(0, p.device_to_ns - p.device_from_ns) AS device_ns,
      coalesce(h.hidden_ns, 0) AS hidden_ns
    FROM _what_if_overlap_periods AS p
    LEFT JOIN _what_if_overlap_hidden AS h ON h.global_tid = p.global_tid AND h.step_range_id = p.step_range_id
  ),
  model AS (
    SELECT
      *,
      iteration_ns - device_ns AS host_ns,
      coalesce(lead(hidden_ns) OVER run, 0) AS hidden_next_ns,
      iteration_ns - device_ns - CASE WHEN first_in_run THEN 0 ELSE hidden_ns END AS exposed_ns,
      min(period_start_ns) OVER run AS run_start_ns
    FROM own
    WINDOW run AS (PARTITION BY global_tid, run ORDER BY host_start_ns, step_range_id)
  )
SELECT
  global_tid,
  iteration,
  first_in_run,
  iteration_ns,
  device_ns,
  host_ns,
  hidden_ns,
  hidden_next_ns,
  exposed_ns,
  greatest(device_ns, hidden_next_ns) + exposed_ns,
  host_end_ns,
  (run_start_ns + sum(greatest(device_ns, hidden_next_ns) + exposed_ns) OVER (
    PARTITION BY global_tid, run ORDER BY host_start_ns, step_range_id ROWS UNBOUNDED PRECEDING))::BIGINT
FROM model
ORDER BY global_tid, host_start_ns, step_range_id;

-- Per request: TPOT measured and predicted, from its tokens in the trace (request_latency_trace_tokens), each at the measured and at the predicted end of the iteration that sampled it.
CREATE VIEW what_if_overlap_requests (
  -- The track whose iterations sampled its tokens.
  global_tid,
  -- The request (payload of its arrive mark).
  request_id,
  -- Tokens it got in the iterations of what_if_overlap.
  output_tokens,
  -- Measured TPOT: (last token - first token) / (output_tokens - 1); NULL with fewer than 2 tokens.
  tpot_ns,
  -- The same from the predicted token times.
  predicted_tpot_ns
) AS
SELECT
  w.global_tid,
  t.request_id,
  count(*),
  CASE WHEN count(*) > 1 THEN (max(w.end_ns) - min(w.end_ns)) / (count(*) - 1) END,
  CASE WHEN count(*) > 1 THEN (max(w.predicted_end_ns) - min(w.predicted_end_ns)) / (count(*) - 1) END
FROM request_latency_trace_tokens AS t
JOIN what_if_overlap AS w ON w.iteration = t.iteration
GROUP BY w.global_tid, t.request_id
ORDER BY w.global_tid, t.request_id;

-- Per track: wall time, throughput and TPOT, measured and predicted with the `hide` phases run behind the device (what_if_overlap).
CREATE VIEW what_if_overlap_summary (
  -- The track.
  global_tid,
  -- Iterations with a device interval and a closed step range.
  iterations,
  -- Iterations that start a run (what_if_overlap.first_in_run): 1 plus the idle stretches.
  runs,
  -- Tokens sampled in those iterations, from the trace's `tokens` marks; 0 when it has none.
  tokens,
  -- Time of the hidden phases (sum of hidden_ns).
  hidden_ns,
  -- Measured: from the first iteration's step start to the last one's end.
  wall_ns,
  -- Predicted: from the same start to the last predicted end (idle stretches kept as measured).
  predicted_wall_ns,
  -- wall_ns / predicted_wall_ns: the throughput gain (1.0 for none), tokens or no tokens.
  speedup,
  -- tokens / wall_ns, per second; NULL without tokens.
  tokens_per_s,
  -- tokens / predicted_wall_ns, per second; NULL without tokens.
  predicted_tokens_per_s,
  -- Median iteration_ns.
  iteration_p50_ns,
  -- Median predicted_ns.
  predicted_iteration_p50_ns,
  -- Median TPOT over requests with 2 tokens or more (what_if_overlap_requests.tpot_ns).
  tpot_p50_ns,
  -- Median predicted TPOT.
  predicted_tpot_p50_ns,
  -- 99th percentile TPOT (nearest rank).
  tpot_p99_ns,
  -- 99th percentile predicted TPOT (nearest rank).
  predicted_tpot_p99_ns
) AS
WITH
  per_track AS (
    SELECT
      global_tid,
      count(*) AS n,
      count(*) FILTER (WHERE first_in_run) AS runs,
      sum(hidden_ns)::BIGINT AS hidden_ns,
      min(end_ns - iteration_ns) AS start_ns,
      max(end_ns) AS end_ns,
      max(predicted_end_ns) AS predicted_end_ns,
      quantile_disc(iteration_ns, 0.5) AS p50,
      quantile_disc(predicted_ns, 0.5) AS predicted_p50
    FROM what_if_overlap
    GROUP BY global_tid
  ),
  requests AS (
    SELECT
      global_tid,
      sum(output_tokens)::BIGINT AS tokens,
      quantile_disc(tpot_ns, 0.5) AS p50,
      quantile_disc(predicted_tpot_ns, 0.5) AS predicted_p50,
      quantile_disc(tpot_ns, 0.99) AS p99,
      quantile_disc(predicted_tpot_ns, 0.99) AS predicted_p99
    FROM what_if_overlap_requests
    GROUP BY global_tid
  )
SELECT
  i.global_tid,
  i.n,
  i.runs,
  coalesce(r.tokens, 0),
  i.hidden_ns,
  i.end_ns - i.start_ns,
  i.predicted_end_ns - i.start_ns,
  (i.end_ns - i.start_ns) / nullif(i.predicted_end_ns - i.start_ns, 0),
  r.tokens * 1e9 / nullif(i.end_ns - i.start_ns, 0),
  r.tokens * 1e9 / nullif(i.predicted_end_ns - i.start_ns, 0),
  i.p50,
  i.predicted_p50,
  r.p50,
  r.predicted_p50,
  r.p99,
  r.predicted_p99
FROM per_track AS i
LEFT JOIN requests AS r ON r.global_tid = i.global_tid
ORDER BY i.global_tid;
