-- Step counts: per iteration, the prefill and decode requests and tokens its step range's text carries.
--
-- Two engines write the batch into the iteration range's name. vLLM (vllm/v1/worker/gpu_worker.py,
-- Worker.annotate_profile) writes `execute_context_{reqs}({tokens})_generation_{reqs}({tokens})`, a
-- context request being one that has produced no output token yet (a new one or a chunk of a long
-- prompt); TensorRT-LLM (tensorrt_llm/_torch/pyexecutor/py_executor.py, PyExecutor._forward_step)
-- writes `[Executor] _forward_step {iter}: {N} ctx reqs, {M} gen reqs`, without token counts. Other
-- steps, and vLLM's older `execute_new_{n}_cached_{m}`, carry none: their counts are NULL.

-- One row per iteration (iterations.sql), with the counts its step's text carries.
CREATE VIEW step_counts (
  -- Iteration number (iterations.iteration).
  iteration,
  -- The track: global id of the thread that ran the step range.
  global_tid,
  -- The step range (nvtx_ranges.range_id).
  step_range_id,
  -- Requests in their prefill (vLLM: context requests; TensorRT-LLM: ctx reqs); NULL where the text carries none.
  prefill_requests,
  -- Tokens those requests ran (vLLM only).
  prefill_tokens,
  -- Requests decoding (vLLM: generation requests; TensorRT-LLM: gen reqs).
  decode_requests,
  -- Tokens those requests ran (vLLM only).
  decode_tokens
) AS
WITH
  steps AS (
    SELECT i.iteration, i.global_tid, i.step_range_id, r.text, i.host_start_ns
    FROM iterations AS i
    JOIN nvtx_ranges AS r ON r.range_id = i.step_range_id
  ),
  parsed AS (
    SELECT
      *,
      regexp_extract(text, 'execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)',
                     ['prefill_requests', 'prefill_tokens', 'decode_requests', 'decode_tokens']) AS vllm,
      regexp_extract(text, '_forward_step \d*: (\d+) ctx reqs, (?:\d+ ctx tokens, )?(\d+) gen reqs',
                     ['prefill_requests', 'decode_requests']) AS trtllm
    FROM steps
  )
SELECT
  iteration,
  global_tid,
  step_range_id,
  coalesce(try_cast(nullif(vllm.prefill_requests, '') AS BIGINT), try_cast(nullif(trtllm.prefill_requests, '') AS BIGINT)),
  try_cast(nullif(vllm.prefill_tokens, '') AS BIGINT),
  coalesce(try_cast(nullif(vllm.decode_requests, '') AS BIGINT), try_cast(nullif(trtllm.decode_requests, '') AS BIGINT)),
  try_cast(nullif(vllm.decode_tokens, '') AS BIGINT)
FROM parsed
ORDER BY global_tid, host_start_ns, step_range_id;
