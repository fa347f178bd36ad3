-- The capture of a run, rebuilt from its run log: what this engine's NVTX ranges and marks would have
-- recorded, as views over run_iterations and run_events, for a database that holds a run directory
-- and no capture. The library creates them there (queries/library.py), so every view over a capture
-- (iterations, host_gaps, what_if_overlap, request_latency_trace, ...) runs over a run log unchanged:
-- one definition of each, whatever the source.
--
-- What the log says, and so what the rebuilt capture holds, on the run's clock:
-- - each iteration's `step` range (payload: the iteration), push/pop from start_ns to end_ns; in
--   overlap mode a start/end range, as the engine records it there;
-- - without overlap, its six phases as push/pop ranges inside the step, laid end to end in their
--   order from start_ns: the engine times them so (each from the last one's end, adding up to the
--   iteration), and its forward phase is the device interval (device_start_ns to device_end_ns); an
--   iteration that ran no sequence (num_seqs 0) had no forward pass and ran its schedule phase alone;
-- - in overlap mode, the forward pass as a `forward` range numbered by the iteration, on a thread of
--   its own (the log times each phase's length there but not where it lies, so no other phase);
-- - the marks: `arrive` at intake, `admit` at the start of the step that first schedules the
--   request, `finish` when it ended, and `tokens` marks that say from which iteration each request
--   gets a token and from which it stops (one mark per change).
-- No GPU work: gpu_ops, cuda_api and nvtx_gpu_projection are empty, as on a capture of a CPU run.
-- They are views of the session only (`query --install` writes none of them into the file), and a
-- QueryDB's `missing` still names these tables: the database itself recorded no capture.

CREATE TEMP VIEW nvtx_ranges AS
WITH
  meta AS (SELECT coalesce(try_cast(json_extract(any_value(config_json), '$.overlap') AS BOOLEAN), false) AS overlap
           FROM run_meta),
  steps AS (
    SELECT i.*, m.overlap FROM run_iterations AS i, meta AS m
  ),
  phases AS (
    SELECT iteration, start_ns, num_seqs > 0 AS forward, p.n AS n, p.text AS text, p.dur AS dur_ns,
           (start_ns + sum(p.dur) OVER (PARTITION BY iteration ORDER BY p.n) - p.dur)::BIGINT AS phase_start_ns
    FROM steps,
         unnest([{'n': 1, 'text': 'schedule', 'dur': schedule_ns}, {'n': 2, 'text': 'prepare', 'dur': prepare_ns},
                 {'n': 3, 'text': 'forward', 'dur': forward_ns}, {'n': 4, 'text': 'sample', 'dur': sample_ns},
                 {'n': 5, 'text': 'detokenize', 'dur': detokenize_ns},
                 {'n': 6, 'text': 'postprocess', 'dur': postprocess_ns}]) AS u(p)
    WHERE NOT overlap
  ),
  ranges AS (
    SELECT iteration * 8 AS range_id, CASE WHEN overlap THEN 'start_end' ELSE 'push_pop' END AS range_kind,
           start_ns, end_ns, 'step' AS text, 1 AS global_tid, iteration AS int64_value, NULL::BIGINT AS parent_range_id,
           0 AS depth
    FROM steps
    UNION ALL
    SELECT iteration * 8 + n, 'push_pop', phase_start_ns, phase_start_ns + dur_ns, text, 1, NULL, iteration * 8, 1
    FROM phases
    WHERE dur_ns IS NOT NULL AND (forward OR n = 1)  -- the engine runs every phase, or schedule alone
    UNION ALL
    SELECT iteration * 8 + 7, 'push_pop', device_start_ns, device_end_ns, 'forward', 2, iteration, NULL, 0
    FROM steps
    WHERE overlap AND device_start_ns IS NOT NULL
  )
SELECT
  range_id::BIGINT AS range_id, range_kind, start_ns::BIGINT AS start_ns, end_ns::BIGINT AS end_ns,
  (end_ns - start_ns)::BIGINT AS dur_ns, text,
  0::BIGINT AS domain_id, 'itertrace' AS domain_name, NULL::BIGINT AS category_id, NULL::VARCHAR AS category_name,
  NULL::BIGINT AS color, global_tid::BIGINT AS global_tid, 1::BIGINT AS global_pid, 1::BIGINT AS pid,
  global_tid::BIGINT AS tid, CASE global_tid WHEN 1 THEN 'engine' ELSE 'device' END AS thread_name,
  NULL::BIGINT AS end_global_tid, int64_value::BIGINT AS int64_value, NULL::UBIGINT AS uint64_value,
  NULL::INTEGER AS int32_value, NULL::UINTEGER AS uint32_value, NULL::DOUBLE AS double_value,
  NULL::FLOAT AS float_value, NULL::VARCHAR AS json_text, parent_range_id::BIGINT AS parent_range_id,
  depth::INTEGER AS depth
FROM ranges;

CREATE TEMP VIEW nvtx_marks AS
WITH
  tokens AS (
    SELECT DISTINCT request_id, iteration FROM run_events WHERE kind IN ('first_token', 'token')
  ),
  changes AS (
    -- a request starts getting a token at an iteration after one in which it got none, and stops after
    -- its last of a stretch
    SELECT 'tokens +' || request_id AS text, iteration AS payload, NULL::BIGINT AS ts_ns FROM tokens AS t
    WHERE NOT EXISTS (SELECT 1 FROM tokens AS p WHERE p.request_id = t.request_id AND p.iteration = t.iteration - 1)
    UNION ALL
    SELECT 'tokens -' || request_id, iteration + 1, NULL FROM tokens AS t
    WHERE NOT EXISTS (SELECT 1 FROM tokens AS n WHERE n.request_id = t.request_id AND n.iteration = t.iteration + 1)
  ),
  marks AS (
    SELECT c.text, c.payload, coalesce(i.start_ns, (SELECT max(end_ns) FROM run_iterations)) AS ts_ns
    FROM changes AS c LEFT JOIN run_iterations AS i ON i.iteration = c.payload
    UNION ALL
    SELECT CASE kind WHEN 'arrive' THEN 'arrive' WHEN 'admit' THEN 'admit' ELSE 'finish' END, request_id, ts_ns
    FROM run_events
    WHERE kind IN ('arrive', 'admit', 'finish', 'cancel', 'reject')
  )
SELECT
  (row_number() OVER (ORDER BY ts_ns, text, payload))::BIGINT AS mark_id, ts_ns, text, 0::BIGINT AS domain_id,
  'itertrace' AS domain_name, NULL::BIGINT AS category_id, NULL::VARCHAR AS category_name, NULL::BIGINT AS color,
  1::BIGINT AS global_tid, 1::BIGINT AS global_pid, 1::BIGINT AS pid, 1::BIGINT AS tid, 'engine' AS thread_name,
  payload::BIGINT AS int64_value, NULL::UBIGINT AS uint64_value, NULL::INTEGER AS int32_value,
  NULL::UINTEGER AS uint32_value, NULL::DOUBLE AS double_value, NULL::FLOAT AS float_value, NULL::VARCHAR AS json_text
FROM marks;

CREATE TEMP VIEW gpu_ops AS
SELECT NULL::BIGINT AS gpu_op_id, NULL::VARCHAR AS kind, NULL::BIGINT AS start_ns, NULL::BIGINT AS end_ns,
       NULL::BIGINT AS dur_ns, NULL::VARCHAR AS name, NULL::VARCHAR AS short_name, NULL::BIGINT AS device_id,
       NULL::BIGINT AS context_id, NULL::BIGINT AS stream_id, NULL::BIGINT AS correlation_id,
       NULL::BIGINT AS global_pid, NULL::BIGINT AS pid, NULL::BIGINT AS bytes, NULL::VARCHAR AS copy_kind,
       NULL::VARCHAR AS launch_type
WHERE false;

CREATE TEMP VIEW cuda_api AS
SELECT NULL::BIGINT AS api_id, NULL::BIGINT AS start_ns, NULL::BIGINT AS end_ns, NULL::BIGINT AS dur_ns,
       NULL::VARCHAR AS name, NULL::BIGINT AS event_class, NULL::VARCHAR AS event_class_name,
       NULL::BIGINT AS global_tid, NULL::BIGINT AS global_pid, NULL::BIGINT AS pid, NULL::BIGINT AS tid,
       NULL::BIGINT AS correlation_id, NULL::BIGINT AS return_value
WHERE false;

CREATE TEMP VIEW nvtx_gpu_projection AS
SELECT NULL::BIGINT AS range_id, NULL::BIGINT AS gpu_start_ns, NULL::BIGINT AS gpu_end_ns,
       NULL::BIGINT AS gpu_dur_ns, NULL::BIGINT AS gpu_op_count, NULL::BIGINT AS launch_count
WHERE false;
