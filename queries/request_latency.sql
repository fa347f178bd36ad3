-- Request latency, computed twice and independently: from the engine's run log, and from the nsys
-- trace alone; a third view shows where the two differ.
--
-- A token exists when the iteration that sampled it ends. TTFT = first token - arrival; TPOT =
-- (last token - first token) / (tokens - 1); ITL = the differences between consecutive token times;
-- queue time = start of the first iteration that ran the request - arrival; end-to-end = last token -
-- arrival. The log gives arrivals, token events and iterations on the run's clock. The trace gives
-- them from this engine's NVTX: `arrive` marks (payload = request id), `admit` marks inside the step
-- that first ran a request, `tokens` marks (payload = iteration; text `tokens +ids -ids`: which
-- requests start and stop getting a token each iteration), and the step ranges' ends. The two
-- clocks differ, so only durations are compared. A trace cannot see a request before the engine
-- takes it in (its arrive mark), which on a live run is up to one iteration after it arrived; the
-- log holds both times, so the comparison measures the log's latencies from intake too and shows
-- the intake delay it leaves out.
--
-- @uses iterations

-- Every token of every request, from the run log's token events.
CREATE VIEW request_latency_log_tokens (
  -- The request (run_requests.request_id).
  request_id,
  -- 0 for the first token, 1 for the second, ...
  token_index,
  -- Iteration that sampled the token.
  iteration,
  -- End of that iteration: when the token exists, in ns on the run's clock.
  ts_ns
) AS
SELECT
  request_id,
  row_number() OVER (PARTITION BY request_id ORDER BY iteration, ts_ns) - 1,
  iteration,
  ts_ns
FROM run_events
WHERE kind IN ('first_token', 'token')
ORDER BY request_id, iteration;

-- Per request, changes in whether it gets a token, from the `tokens` marks: +1 from an iteration on, -1 from another on.
CREATE VIEW _request_latency_token_changes AS
WITH
  marks AS (
    SELECT int64_value AS iteration, text
    FROM nvtx_marks
    WHERE domain_name = 'itertrace' AND (text = 'tokens' OR text LIKE 'tokens %')
  ),
  changes AS (
    SELECT iteration, unnest(string_split(nullif(regexp_extract(text, '\+([0-9,]+)', 1), ''), ',')) AS id, 1 AS delta
    FROM marks
    UNION ALL
    SELECT iteration, unnest(string_split(nullif(regexp_extract(text, '-([0-9,]+)', 1), ''), ',')), -1
    FROM marks
  )
SELECT id::BIGINT AS request_id, iteration, delta FROM changes;

-- Every token of every request, from the trace alone.
CREATE VIEW request_latency_trace_tokens (
  -- The request (payload of its arrive mark).
  request_id,
  -- 0 for the first token, 1 for the second, ...
  token_index,
  -- Iteration that sampled the token (payload of its step range).
  iteration,
  -- End of that iteration's step range: when the token exists, in ns since the capture started.
  ts_ns
) AS
WITH
  added AS (SELECT request_id, iteration FROM _request_latency_token_changes WHERE delta = 1),
  removed AS (SELECT request_id, iteration FROM _request_latency_token_changes WHERE delta = -1),
  -- Each stretch of iterations [first, stop) in which the request got a token every iteration: from
  -- an addition to the first removal after it (a sort-based ASOF join; a removal with no addition
  -- before it, as at the start of a capture begun mid-run, starts nothing).
  stretches AS (
    SELECT a.request_id, a.iteration AS first, r.iteration AS stop
    FROM added AS a
    ASOF LEFT JOIN removed AS r ON r.request_id = a.request_id AND r.iteration > a.iteration
  ),
  last_step AS (
    SELECT max(iteration) + 1 AS stop FROM iterations
  ),
  token_iterations AS (
    SELECT request_id, unnest(range(first, coalesce(stop, (SELECT stop FROM last_step)))) AS iteration
    FROM stretches
  )
SELECT
  t.request_id,
  row_number() OVER (PARTITION BY t.request_id ORDER BY t.iteration) - 1,
  t.iteration,
  i.host_end_ns
FROM token_iterations AS t
JOIN iterations AS i ON i.iteration = t.iteration
WHERE i.host_end_ns IS NOT NULL  -- a step still open when the capture stopped made no token
ORDER BY t.request_id, t.iteration;

-- Per request: queue time, TTFT, TPOT, ITL and end-to-end latency, from the run log.
CREATE VIEW request_latency_log (
  -- The request.
  request_id,
  -- Arrival, in ns on the run's clock (the workload's arrival time).
  arrival_ns,
  -- When the engine took the request in (its arrive event), at or after arrival_ns: at an iteration boundary.
  intake_ns,
  -- Start of the first iteration that ran the request; NULL if none did.
  first_scheduled_ns,
  -- When its first token existed; NULL if it got none.
  first_token_ns,
  -- When its last token existed; NULL if it got none.
  last_token_ns,
  -- Tokens it got.
  output_tokens,
  -- first_scheduled_ns - arrival_ns.
  queue_ns,
  -- first_token_ns - arrival_ns: time to first token.
  ttft_ns,
  -- (last_token_ns - first_token_ns) / (output_tokens - 1): time per output token after the first; NULL with fewer than 2 tokens.
  tpot_ns,
  -- Inter-token latencies: the differences between consecutive token times, in order.
  itl_ns,
  -- The longest inter-token latency; NULL with fewer than 2 tokens.
  itl_max_ns,
  -- last_token_ns - arrival_ns.
  e2e_ns
) AS
WITH
  -- The token events numbered as in request_latency_log_tokens, read here without that view's
  -- ORDER BY, so that a query of TTFT, TPOT or token counts alone does not sort every token.
  log_tokens AS (
    SELECT request_id, ts_ns, row_number() OVER (PARTITION BY request_id ORDER BY iteration, ts_ns) - 1 AS token_index
    FROM run_events
    WHERE kind IN ('first_token', 'token')
  ),
  gaps AS (
    SELECT request_id, token_index, ts_ns, ts_ns - lag(ts_ns) OVER (PARTITION BY request_id ORDER BY token_index) AS itl
    FROM log_tokens
  ),
  tokens AS (
    SELECT
      request_id,
      count(*) AS n,
      min(ts_ns) AS first_ns,
      max(ts_ns) AS last_ns,
      coalesce(list(itl ORDER BY token_index) FILTER (WHERE itl IS NOT NULL), []) AS itl,
      max(itl) AS itl_max
    FROM gaps
    GROUP BY request_id
  ),
  intake AS (
    SELECT request_id, min(ts_ns) AS ts_ns FROM run_events WHERE kind = 'arrive' GROUP BY request_id
  )
SELECT
  r.request_id,
  r.arrival_ns,
  k.ts_ns,
  i.start_ns,
  t.first_ns,
  t.last_ns,
  coalesce(t.n, 0),
  i.start_ns - r.arrival_ns,
  t.first_ns - r.arrival_ns,
  CASE WHEN t.n > 1 THEN (t.last_ns - t.first_ns) / (t.n - 1) END,
  coalesce(t.itl, []),
  t.itl_max,
  t.last_ns - r.arrival_ns
FROM run_requests AS r
LEFT JOIN run_iterations AS i ON i.iteration = r.first_scheduled_iteration
LEFT JOIN tokens AS t ON t.request_id = r.request_id
LEFT JOIN intake AS k ON k.request_id = r.request_id
ORDER BY r.request_id;

-- Per request: queue time, TTFT, TPOT, ITL and end-to-end latency, from the nsys trace alone.
CREATE VIEW request_latency_trace (
  -- The request (payload of its arrive mark).
  request_id,
  -- Its arrive mark: when the engine took it in, in ns since the capture started.
  arrival_ns,
  -- Start of the step range holding its admit mark; NULL if never scheduled.
  first_scheduled_ns,
  -- End of the step of its first token; NULL if it got none.
  first_token_ns,
  -- End of the step of its last token; NULL if it got none.
  last_token_ns,
  -- Tokens it got (iterations in which it got one).
  output_tokens,
  -- first_scheduled_ns - arrival_ns.
  queue_ns,
  -- first_token_ns - arrival_ns.
  ttft_ns,
  -- (last_token_ns - first_token_ns) / (output_tokens - 1); NULL with fewer than 2 tokens.
  tpot_ns,
  -- Inter-token latencies, in order.
  itl_ns,
  -- The longest inter-token latency; NULL with fewer than 2 tokens.
  itl_max_ns,
  -- last_token_ns - arrival_ns.
  e2e_ns
) AS
WITH
  arrivals AS (
    SELECT int64_value AS request_id, min(ts_ns) AS arrival_ns
    FROM nvtx_marks
    WHERE domain_name = 'itertrace' AND text = 'arrive'
    GROUP BY int64_value
  ),
  admits AS (
    SELECT m.int64_value AS request_id, min(s.start_ns) AS start_ns
    FROM nvtx_marks AS m
    ASOF JOIN iterations_steps AS s ON s.global_tid = m.global_tid AND s.start_ns <= m.ts_ns
    WHERE m.domain_name = 'itertrace' AND m.text = 'admit'
    GROUP BY m.int64_value
  ),
  gaps AS (
    SELECT request_id, token_index, ts_ns, ts_ns - lag(ts_ns) OVER (PARTITION BY request_id ORDER BY token_index) AS itl
    FROM request_latency_trace_tokens
  ),
  tokens AS (
    SELECT
      request_id,
      count(*) AS n,
      min(ts_ns) AS first_ns,
      max(ts_ns) AS last_ns,
      coalesce(list(itl ORDER BY token_index) FILTER (WHERE itl IS NOT NULL), []) AS itl,
      max(itl) AS itl_max
    FROM gaps
    GROUP BY request_id
  )
SELECT
  a.request_id,
  a.arrival_ns,
  d.start_ns,
  t.first_ns,
  t.last_ns,
  coalesce(t.n, 0),
  d.start_ns - a.arrival_ns,
  t.first_ns - a.arrival_ns,
  CASE WHEN t.n > 1 THEN (t.last_ns - t.first_ns) / (t.n - 1) END,
  coalesce(t.itl, []),
  t.itl_max,
  t.last_ns - a.arrival_ns
FROM arrivals AS a
LEFT JOIN admits AS d ON d.request_id = a.request_id
LEFT JOIN tokens AS t ON t.request_id = a.request_id
ORDER BY a.request_id;

-- Per request, the log's and the trace's figures side by side, both measured from intake, with their differences (trace - log).
CREATE VIEW request_latency_compare (
  -- The request; present in the log, the trace, or both.
  request_id,
  -- From arrival to intake by the log: what the trace cannot see, left out of every figure below.
  intake_delay_ns,
  -- Tokens by the log.
  output_tokens_log,
  -- Tokens by the trace.
  output_tokens_trace,
  -- Queue time from intake by the trace minus by the log.
  queue_diff_ns,
  -- TTFT from intake by the log: first_token_ns - intake_ns.
  ttft_log_ns,
  -- TTFT by the trace (from its arrive mark).
  ttft_trace_ns,
  -- ttft_trace_ns - ttft_log_ns.
  ttft_diff_ns,
  -- TPOT by the log.
  tpot_log_ns,
  -- TPOT by the trace.
  tpot_trace_ns,
  -- tpot_trace_ns - tpot_log_ns.
  tpot_diff_ns,
  -- Longest ITL by the trace minus by the log.
  itl_max_diff_ns,
  -- End-to-end from intake by the trace minus by the log.
  e2e_diff_ns,
  -- The largest absolute difference between the k-th ITL by the trace and by the log, over the ITLs both have.
  itl_abs_diff_max_ns
) AS
WITH
  log_itl AS (
    SELECT request_id, token_index, ts_ns - lag(ts_ns) OVER (PARTITION BY request_id ORDER BY token_index) AS itl
    FROM request_latency_log_tokens
  ),
  trace_itl AS (
    SELECT request_id, token_index, ts_ns - lag(ts_ns) OVER (PARTITION BY request_id ORDER BY token_index) AS itl
    FROM request_latency_trace_tokens
  ),
  itl_diff AS (
    SELECT l.request_id, max(abs(t.itl - l.itl)) AS diff
    FROM log_itl AS l
    JOIN trace_itl AS t ON t.request_id = l.request_id AND t.token_index = l.token_index
    GROUP BY l.request_id
  )
SELECT
  coalesce(l.request_id, t.request_id),
  l.intake_ns - l.arrival_ns,
  l.output_tokens,
  t.output_tokens,
  t.queue_ns - (l.first_scheduled_ns - l.intake_ns),
  l.first_token_ns - l.intake_ns,
  t.ttft_ns,
  t.ttft_ns - (l.first_token_ns - l.intake_ns),
  l.tpot_ns,
  t.tpot_ns,
  t.tpot_ns - l.tpot_ns,
  t.itl_max_ns - l.itl_max_ns,
  t.e2e_ns - (l.last_token_ns - l.intake_ns),
  d.diff
FROM request_latency_log AS l
FULL JOIN request_latency_trace AS t ON t.request_id = l.request_id
LEFT JOIN itl_diff AS d ON d.request_id = coalesce(l.request_id, t.request_id)
ORDER BY 1;
