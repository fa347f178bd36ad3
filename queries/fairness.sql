-- Fairness, from the run log: per request its longest stall, preemptions and resumptions, and the
-- progress of one request (by default the longest) under a stream of others.
--
-- @param repeat_threshold BIGINT (>=1) Preemptions from which a request counts as repeatedly preempted; 2 when not given.
-- @param request_id BIGINT The request fairness_progress follows; the one with the most output tokens (then the lowest id) when not given.
--
-- @uses request_latency

-- One row per request: stalls, preemptions and resumptions.
CREATE VIEW fairness (
  -- The request.
  request_id,
  -- Tokens generated.
  output_tokens,
  -- Longest time between two consecutive tokens (the longest ITL), in ns; NULL with fewer than 2 tokens.
  longest_stall_ns,
  -- Most iterations between two consecutive tokens, minus one: iterations in a row it got no token while decoding; NULL with fewer than 2 tokens.
  longest_stall_iterations,
  -- Times it was preempted.
  preemptions,
  -- Times it resumed after a preemption.
  resumptions,
  -- True when preemptions >= repeat_threshold.
  repeatedly_preempted,
  -- Its final state (run_requests.final_state).
  final_state
) AS
WITH
  gaps AS (
    SELECT
      request_id,
      ts_ns - lag(ts_ns) OVER w AS stall_ns,
      iteration - lag(iteration) OVER w - 1 AS stall_iterations
    FROM request_latency_log_tokens
    WINDOW w AS (PARTITION BY request_id ORDER BY token_index)
  ),
  stalls AS (
    SELECT request_id, count(*) AS tokens, max(stall_ns) AS stall_ns, max(stall_iterations) AS stall_iterations
    FROM gaps
    GROUP BY request_id
  ),
  moves AS (
    SELECT
      request_id,
      count(*) FILTER (WHERE kind = 'preempt') AS preemptions,
      count(*) FILTER (WHERE kind = 'resume') AS resumptions
    FROM run_events
    GROUP BY request_id
  )
SELECT
  r.request_id,
  r.output_tokens,
  s.stall_ns,
  s.stall_iterations,
  coalesce(m.preemptions, 0),
  coalesce(m.resumptions, 0),
  coalesce(m.preemptions, 0) >= coalesce(getvariable('repeat_threshold')::BIGINT, 2),
  r.final_state
FROM run_requests AS r
LEFT JOIN stalls AS s ON s.request_id = r.request_id
LEFT JOIN moves AS m ON m.request_id = r.request_id
ORDER BY r.request_id;

-- The progress of one request (parameter request_id; by default the one with the most tokens): one row per token.
CREATE VIEW fairness_progress (
  -- The request followed.
  request_id,
  -- Tokens it had after this one: 1, 2, ...
  tokens,
  -- Iteration that sampled the token.
  iteration,
  -- When the token existed, in ns on the run's clock.
  ts_ns,
  -- ts_ns minus the request's arrival.
  since_arrival_ns,
  -- Other requests that ran tokens in the same iteration.
  others_working
) AS
WITH
  chosen AS (
    SELECT coalesce(
      getvariable('request_id')::BIGINT,
      (SELECT request_id FROM run_requests ORDER BY output_tokens DESC, request_id LIMIT 1)) AS request_id
  )
SELECT
  t.request_id,
  t.token_index + 1,
  t.iteration,
  t.ts_ns,
  t.ts_ns - r.arrival_ns,
  i.num_seqs - 1
FROM request_latency_log_tokens AS t
JOIN chosen AS c ON c.request_id = t.request_id
JOIN run_requests AS r ON r.request_id = t.request_id
JOIN run_iterations AS i ON i.iteration = t.iteration
ORDER BY t.token_index;
