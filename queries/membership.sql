-- Batch membership and slots, from the run log: who held a slot in each iteration, what each slot
-- did, and the stranded slot-time behind the static-versus-continuous table of the worked example.
--
-- A slot is one place of the batch's capacity (the sequence budget). In an iteration that ran a
-- forward pass, each slot is working (its request ran tokens), held by a finished request (static
-- batching keeps finished members until the batch's longest member finishes), stalled (a live
-- member that ran nothing, e.g. a prefill held back by the token budget) or empty. Iterations
-- without a forward pass (nothing runnable) hold no slot-time and are left out of the totals.

-- One row per iteration and member: who held which place of the batch, doing what.
CREATE VIEW membership (
  -- Iteration (run_iterations.iteration).
  iteration,
  -- A request holding a slot.
  request_id,
  -- Its place in the iteration's member list, from 0.
  position,
  -- 'working' (ran tokens), 'finished' (finished, slot still held) or 'stalled' (live, ran nothing).
  state
) AS
WITH
  members AS (
    SELECT iteration, unnest(member_ids) AS request_id, unnest(range(len(member_ids))) AS position
    FROM run_iterations
  ),
  working AS (
    SELECT iteration, unnest(scheduled_ids) AS request_id FROM run_iterations
  ),
  finished AS (
    SELECT iteration, unnest(finished_member_ids) AS request_id FROM run_iterations
  )
SELECT
  m.iteration,
  m.request_id,
  m.position,
  CASE WHEN w.request_id IS NOT NULL THEN 'working' WHEN f.request_id IS NOT NULL THEN 'finished' ELSE 'stalled' END
FROM members AS m
LEFT JOIN working AS w ON w.iteration = m.iteration AND w.request_id = m.request_id
LEFT JOIN finished AS f ON f.iteration = m.iteration AND f.request_id = m.request_id
ORDER BY m.iteration, m.position;

-- One row per iteration: slots by what they did, and the tokens it ran.
CREATE VIEW membership_iterations (
  -- Iteration.
  iteration,
  -- Its duration, in ns on the run's clock.
  dur_ns,
  -- Slots: the sequence budget.
  capacity,
  -- Slots whose request ran tokens.
  working,
  -- Slots held by finished requests (static batching).
  finished,
  -- Slots held by live requests that ran nothing.
  stalled,
  -- Slots no request held.
  empty,
  -- Prompt (or recomputed) tokens run.
  prefill_tokens,
  -- Decode tokens run.
  decode_tokens,
  -- prefill_tokens + decode_tokens.
  active_tokens,
  -- Requests waiting (never run, or preempted), after scheduling.
  waiting,
  -- What stopped the scheduler adding work (run_iterations.limit).
  limit_reason,
  -- True when the iteration ran a forward pass.
  ran
) AS
SELECT
  iteration,
  dur_ns,
  seq_budget,
  num_seqs,
  slots_finished,
  slots_stalled,
  slots_empty,
  prefill_tokens,
  decode_tokens,
  prefill_tokens + decode_tokens,
  num_waiting + num_preempted,
  "limit",
  num_seqs > 0
FROM run_iterations
ORDER BY iteration;

-- The run's slot-time: one row with the totals of membership_iterations over iterations that ran.
CREATE VIEW membership_slot_time (
  -- Scheduling mode of the run (run_meta.mode).
  mode,
  -- Scheduling policy (run_meta.policy).
  policy,
  -- True when the run was simulated.
  simulated,
  -- Iterations that ran a forward pass.
  iterations,
  -- Slot-iterations: capacity summed over those iterations.
  slot_iterations,
  -- Slot-iterations whose request ran tokens.
  working,
  -- Slot-iterations held by finished requests: stranded slot-time.
  finished,
  -- Slot-iterations held by live requests that ran nothing.
  stalled,
  -- Slot-iterations no request held.
  empty,
  -- slot_iterations - working: every slot-iteration that did no work.
  idle,
  -- idle / slot_iterations.
  idle_share,
  -- Idle slot-iterations in iterations after which requests were still waiting.
  idle_while_waiting,
  -- Tokens run (prefill and decode).
  active_tokens,
  -- Wall time of those iterations, in ns on the run's clock.
  dur_ns
) AS
SELECT
  (SELECT mode FROM run_meta),
  (SELECT policy FROM run_meta),
  (SELECT simulated FROM run_meta),
  count(*),
  coalesce(sum(capacity), 0)::BIGINT,
  coalesce(sum(working), 0)::BIGINT,
  coalesce(sum(finished), 0)::BIGINT,
  coalesce(sum(stalled), 0)::BIGINT,
  coalesce(sum(empty), 0)::BIGINT,
  coalesce(sum(capacity - working), 0)::BIGINT,
  sum(capacity - working) / nullif(sum(capacity), 0),
  coalesce(sum(capacity - working) FILTER (WHERE waiting > 0), 0)::BIGINT,
  coalesce(sum(active_tokens), 0)::BIGINT,
  coalesce(sum(dur_ns), 0)::BIGINT
FROM membership_iterations
WHERE ran;

-- Per request that held a slot after finishing: how long it was stranded there.
CREATE VIEW membership_stranded (
  -- The request.
  request_id,
  -- First iteration in which it held a slot although finished.
  first_iteration,
  -- Iterations in which it held a slot although finished.
  iterations,
  -- Wall time of those iterations, in ns on the run's clock.
  stranded_ns
) AS
SELECT m.request_id, min(m.iteration), count(*), sum(i.dur_ns)::BIGINT
FROM membership AS m
JOIN run_iterations AS i ON i.iteration = m.iteration
WHERE m.state = 'finished'
GROUP BY m.request_id
ORDER BY m.request_id;
