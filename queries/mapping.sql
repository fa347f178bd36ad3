-- Which NVTX ranges mean an iteration, its device work and its host phases.
--
-- Presets: `itertrace` (this engine's names), `vllm`, `sglang`, `trtllm` (the names those engines
-- emit, read from their source; see the comments on each below), and `generic` (any program with a
-- range per iteration: give its name pattern, e.g. --param step_pattern='^decode_step_\d+$'). `auto`,
-- the default of itertrace's commands, picks one from the capture (queries/suggest.py): this engine's
-- names where present, else a known engine's whose step ranges are present, else the range that
-- `mapping_suggest` ranks first; it is resolved in Python, so a plain DuckDB session that sets no
-- `preset` variable gets the `itertrace` preset. Any key below given as a parameter overrides the
-- preset's value. Patterns are RE2 regular expressions searched in the range's text (anchor them with
-- ^...$ for a whole-name match).
--
-- @param preset VARCHAR (itertrace|generic|auto|vllm|sglang|trtllm) Mapping preset; auto when not given (itertrace in a plain DuckDB session).
-- @param step_pattern VARCHAR Pattern of the range that is one iteration (required with preset=generic).
-- @param domain VARCHAR NVTX domain of the step, phase and device ranges; empty for any domain.
-- @param phase_pattern VARCHAR Pattern of the host-phase ranges; its first capture group, where it matches, names the phase.
-- @param device_pattern VARCHAR Pattern of the range that is an iteration's device work when it launched no GPU work; empty for none.
-- @param iteration_from VARCHAR (payload|text|order) Iteration numbers: the step's int64 payload, the step pattern's first capture group, or 0, 1, ... by start on each thread.
--
-- The mapping is read through macros so that each pattern is a constant when a query runs (a
-- pattern read from a table would be compiled again for every row).

-- Each preset's iteration range.
--   itertrace: profiler/nvtx_ranges.py, one push/pop `step` per iteration (payload = iteration).
--   vllm: vllm/v1/worker/gpu_worker.py, Worker.annotate_profile wraps each Worker.execute_model (one
--     engine step: the scheduler's output for one batch) in a range named by the step's batch,
--     `execute_context_{reqs}({tokens})_generation_{reqs}({tokens})` (`execute_new_{n}_cached_{m}`
--     in older releases); vllm/profiler/wrapper.py opens it with torch.cuda.nvtx.range when the
--     server runs with the CUDA profiler (--profiler-config.profiler=cuda), in the default domain.
--   sglang: python/sglang/srt/utils/nvtx_utils.py, with SGLANG_ENABLE_NVTX_SCHEDULER=1. The
--     scheduler's event loop (event_loop_normal or event_loop_overlap in managers/scheduler.py) calls
--     run_batch exactly once per batch it launches, so `scheduler.run_batch` is one iteration; ranges
--     around the whole loop (some forks add `scheduler.event_loop_*`) stay open for the whole run and
--     are not one iteration.
--   trtllm: tensorrt_llm/_torch/pyexecutor/py_executor.py, PyExecutor._forward_step wraps each
--     forward in `[Executor] _forward_step {iter}: {N} ctx reqs, {M} gen reqs` (nvtx_range of
--     tensorrt_llm/_utils.py: domain TensorRT-LLM); every tensor-parallel rank, a process of its
--     own, emits its own copy, so each rank is its own track.
CREATE MACRO mapping_preset_step_pattern(preset) AS CASE preset
  WHEN 'itertrace' THEN '^step$'
  WHEN 'vllm' THEN '^execute_(context_\d+\(\d+\)_generation_\d+\(\d+\)|new_\d+_cached_\d+)$'
  WHEN 'sglang' THEN '^scheduler\.run_batch$'
  WHEN 'trtllm' THEN '^\[Executor\] _forward_step ?(\d*): \d+ ctx reqs' END;

-- Each preset's NVTX domain; NULL for any (vLLM and SGLang write to the default domain).
CREATE MACRO mapping_preset_domain(preset) AS CASE preset
  WHEN 'itertrace' THEN 'itertrace'
  WHEN 'trtllm' THEN 'TensorRT-LLM' END;

-- Each preset's host phases; the first capture group names the phase.
--   vllm: gpu_model_runner.py's record_function_or_nullcontext scopes (vllm/v1/utils.py opens them
--     with nvtx.annotate under VLLM_NVTX_SCOPES_FOR_PROFILING=1): preprocess, forward, postprocess,
--     sample, draft, bookkeep, eplb, ModelRunnerOutput, AsyncGPUModelRunnerOutput,
--     set_async_sampled_token_ids, named after the colon.
--   sglang: the scheduler stages nvtx_utils.py names: recv_requests, process_input_requests,
--     get_next_batch_to_run, run_batch, process_batch_result (and any other `scheduler.` range).
--   trtllm: PyExecutor's and its helpers' nvtx_range-decorated methods around the forward step.
CREATE MACRO mapping_preset_phase_pattern(preset) AS CASE preset
  WHEN 'itertrace' THEN '^(schedule|prepare|forward|sample|detokenize|postprocess)$'
  WHEN 'vllm' THEN '^gpu_model_runner: (\w+)$'
  WHEN 'sglang' THEN '^scheduler\.(\w+)$'
  WHEN 'trtllm' THEN '^(_schedule|_fetch_new_requests|broadcast_requests|_prepare_inputs|_sample_async|'
                     || '_process_requests|_update_requests|_handle_responses|_write_finish_reasons|'
                     || 'prepare_resources)$'
  ELSE '' END;

-- Each preset's device range for a run without GPU work; NULL for none.
CREATE MACRO mapping_preset_device_pattern(preset) AS CASE preset WHEN 'itertrace' THEN '^forward$' END;

-- How each preset numbers iterations: this engine's payload, TensorRT-LLM's number in the text,
-- else by order.
CREATE MACRO mapping_preset_iteration_from(preset) AS CASE preset
  WHEN 'itertrace' THEN 'payload' WHEN 'trtllm' THEN 'text' ELSE 'order' END;

CREATE MACRO mapping_preset() AS coalesce(getvariable('preset'), 'itertrace');

CREATE MACRO mapping_step_pattern() AS coalesce(getvariable('step_pattern'), mapping_preset_step_pattern(mapping_preset()));

CREATE MACRO mapping_domain() AS CASE
  WHEN getvariable('domain') IS NOT NULL THEN nullif(getvariable('domain'), '')
  ELSE mapping_preset_domain(mapping_preset()) END;

CREATE MACRO mapping_phase_pattern() AS coalesce(getvariable('phase_pattern'), mapping_preset_phase_pattern(mapping_preset()));

CREATE MACRO mapping_device_pattern() AS CASE
  WHEN getvariable('device_pattern') IS NOT NULL THEN nullif(getvariable('device_pattern'), '')
  ELSE mapping_preset_device_pattern(mapping_preset()) END;

CREATE MACRO mapping_iteration_from() AS coalesce(getvariable('iteration_from'), mapping_preset_iteration_from(mapping_preset()));

-- The phase a host range stands for: the phase pattern's first capture group where it has one,
-- else the range's text with each run of digits replaced by #, so that `aten::mul, op_id = 12` and
-- `aten::mul, op_id = 13` are one phase.
CREATE MACRO mapping_phase_name(text) AS coalesce(
  nullif(regexp_extract(text, mapping_phase_pattern(), 1), ''), regexp_replace(text, '[0-9]+', '#', 'g'));

-- The mapping in effect: one row. Querying it fails with a message when the mapping is incomplete.
CREATE VIEW mapping (
  -- Preset the mapping starts from: itertrace, generic, vllm, sglang, trtllm, or auto where auto found no iteration range.
  preset,
  -- Pattern of the range that is one iteration (the `step` range); NULL when auto found none.
  step_pattern,
  -- NVTX domain of the step, phase and device ranges; NULL for any.
  domain,
  -- Pattern of the host-phase ranges.
  phase_pattern,
  -- Pattern of the range that is an iteration's device work when it launched no GPU work; NULL for none.
  device_pattern,
  -- How iterations are numbered: payload, text or order.
  iteration_from
) AS
SELECT
  mapping_preset(),
  CASE WHEN mapping_step_pattern() IS NULL AND mapping_preset() = 'generic'
    THEN error('parameter step_pattern is missing: the generic mapping needs the pattern of the iteration range, '
               || 'e.g. --param step_pattern=''^decode_step_\d+$'' (`itertrace mapping suggest --db FILE` ranks the '
               || 'ranges that could be one)')
    ELSE mapping_step_pattern() END,
  mapping_domain(),
  mapping_phase_pattern(),
  mapping_device_pattern(),
  CASE WHEN mapping_iteration_from() IN ('payload', 'text', 'order') THEN mapping_iteration_from()
    ELSE error('parameter iteration_from must be payload, text or order, not ' || mapping_iteration_from()) END;

-- The presets with names of their own: one row each, as the preset macros give them.
CREATE VIEW mapping_presets (
  -- Preset name, as --param preset=NAME takes it.
  preset,
  -- Pattern of the preset's iteration range.
  step_pattern,
  -- NVTX domain of its ranges; NULL for any.
  domain,
  -- Pattern of its host-phase ranges.
  phase_pattern,
  -- Pattern of its device range on a run without GPU work; NULL for none.
  device_pattern,
  -- How it numbers iterations: payload, text or order.
  iteration_from
) AS
SELECT p, mapping_preset_step_pattern(p), mapping_preset_domain(p), mapping_preset_phase_pattern(p),
       mapping_preset_device_pattern(p), mapping_preset_iteration_from(p)
FROM (VALUES (1, 'itertrace'), (2, 'vllm'), (3, 'sglang'), (4, 'trtllm')) AS t(position, p)
ORDER BY position;
