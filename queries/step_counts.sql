-- Step counts: per iteration, the batch its step range's text carries (requests, tokens, forward mode).
--
-- Engines write the batch into the iteration range's name, each its own way; the preset in effect
-- says how to read it (queries/presets.toml, `counts`). vLLM (Worker.annotate_profile) writes
-- `execute_context_{reqs}({tokens})_generation_{reqs}({tokens})`, or with detailed_trace_annotation
-- `execute_{tokens}_context_{reqs}(sq{tokens}sk{kv}...)_generation_{reqs}(sq{tokens}sk{kv}...)`, a
-- context request being one that has produced no output token yet (a new one or a chunk of a long
-- prompt); SGLang (ModelRunner.forward's step span) writes `step[{MODE} bs={requests} toks={tokens}]`;
-- TensorRT-LLM (PyExecutor._forward_step) `[Executor] _forward_step {iter}: {N} ctx reqs, {T} ctx
-- tokens, {M} gen reqs`. Other steps, and vLLM's older `execute_new_{n}_cached_{m}`, carry none: their
-- counts are NULL. batch_size and tokens are what the text says, else the sum of its prefill and decode parts.
--
-- @uses iterations, mapping, mapping_presets

-- One row per iteration (iterations.sql), with the counts its step's text carries.
CREATE VIEW step_counts (
  -- Iteration number (iterations.iteration).
  iteration,
  -- The track: global id of the thread that ran the step range.
  global_tid,
  -- The step range (nvtx_ranges.range_id).
  step_range_id,
  -- Forward mode, where the text names one (SGLang: EXTEND, DECODE, MIXED, IDLE, VERIFY, ...).
  mode,
  -- Requests in the step (SGLang: bs), else prefill_requests + decode_requests.
  batch_size,
  -- Tokens the step ran (vLLM's detailed form: its total; SGLang: an EXTEND's toks), else prefill_tokens + decode_tokens.
  tokens,
  -- Requests in their prefill (vLLM: context requests; TensorRT-LLM: ctx reqs).
  prefill_requests,
  -- Tokens those requests ran (vLLM; TensorRT-LLM's newer releases: ctx tokens).
  prefill_tokens,
  -- Requests decoding (vLLM: generation requests; TensorRT-LLM: gen reqs).
  decode_requests,
  -- Tokens those requests ran (vLLM).
  decode_tokens,
  -- Tokens of context the step's attention reads, over all its requests (vLLM's detailed form: the sk sums).
  context_tokens
) AS
WITH
  steps AS (
    SELECT i.iteration, i.global_tid, i.step_range_id, i.host_start_ns,
           mapping_preset_counts(mapping_preset(), r.text) AS c
    FROM iterations AS i
    JOIN nvtx_ranges AS r ON r.range_id = i.step_range_id
  )
SELECT
  iteration,
  global_tid,
  step_range_id,
  c.mode,
  coalesce(c.batch_size, c.prefill_requests + c.decode_requests),
  coalesce(c.tokens, c.prefill_tokens + c.decode_tokens),
  c.prefill_requests,
  c.prefill_tokens,
  c.decode_requests,
  c.decode_tokens,
  c.context_tokens
FROM steps
ORDER BY global_tid, host_start_ns, step_range_id;
