-- Iterations as a trace shows them, each with a host and a device interval. The host interval is
-- the step range (push/pop, or start/end where steps overlap, as in this engine's overlap mode). The
-- device interval is, on CUDA, the GPU projection of the work launched inside the step, and on a run
-- without GPU work, the device-pattern range inside the step (this engine's `forward`), or the one
-- numbered as the step (see _iterations_device_ranges). Range names come from the mapping
-- (mapping.sql), so the same SQL serves other programs' traces.
--
-- @uses mapping

-- The step ranges the mapping names, numbered as it says: the outermost ones, where the pattern also
-- matches a range inside a matching range of its thread (a stack frame around another, such as
-- vLLM's Worker.execute_model around GPUModelRunner.execute_model), so each iteration is one range.
-- Start/end ranges, which may overlap (this engine's overlap mode), are all steps.
CREATE VIEW iterations_steps AS
WITH
  matched AS (
    SELECT
      range_id, global_pid, global_tid, start_ns, end_ns, text, int64_value, range_kind,
      max(coalesce(end_ns, 9223372036854775807)) FILTER (WHERE range_kind <> 'start_end') OVER (
        PARTITION BY global_tid ORDER BY start_ns, range_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
      ) AS open_until_ns
    FROM nvtx_ranges
    WHERE regexp_matches(text, mapping_step_pattern())
      AND (mapping_domain() IS NULL OR domain_name = mapping_domain())
  ),
  outermost AS (
    SELECT * FROM matched
    WHERE range_kind = 'start_end' OR open_until_ns IS NULL OR open_until_ns <= start_ns
       OR open_until_ns < coalesce(end_ns, 9223372036854775807)
  )
SELECT
  range_id,
  global_pid,
  global_tid,
  start_ns,
  end_ns,
  CASE mapping_iteration_from()
    WHEN 'payload' THEN int64_value
    WHEN 'text' THEN try_cast(regexp_extract(text, mapping_step_pattern(), 1) AS BIGINT)
    ELSE row_number() OVER (PARTITION BY global_tid ORDER BY start_ns, range_id) - 1
  END AS iteration
FROM outermost;

-- The device-pattern ranges (this engine's `forward`), each with the iteration it carries where steps
-- are numbered by payload and it has one; a range still open when the capture stopped has no end
-- and counts for nothing.
CREATE VIEW _iterations_device_pattern AS
SELECT
  range_id,
  global_tid,
  global_pid,
  start_ns,
  end_ns,
  CASE WHEN mapping_iteration_from() = 'payload' THEN int64_value END AS iteration
FROM nvtx_ranges
WHERE mapping_device_pattern() IS NOT NULL
  AND regexp_matches(text, mapping_device_pattern())
  AND (mapping_domain() IS NULL OR domain_name = mapping_domain())
  AND end_ns IS NOT NULL;

-- The numbered device ranges, each with its step: the step of that number in its process that
-- encloses it in time, on whatever thread it ran. This engine's overlap mode numbers its forward
-- passes so: they run while the next step has begun (on a device thread on the CPU), so neither the
-- thread nor the time alone says whose they are.
CREATE VIEW _iterations_numbered AS
SELECT s.range_id, d.range_id AS device_range_id, d.start_ns, d.end_ns
FROM _iterations_device_pattern AS d
JOIN iterations_steps AS s
  ON s.global_pid = d.global_pid AND s.iteration = d.iteration
 AND s.start_ns <= d.start_ns AND d.end_ns <= coalesce(s.end_ns, 9223372036854775807);

-- Per step, the span of its device ranges: the numbered ones, and the unnumbered ones that belong to
-- the step that started last at or before them on their thread (a sort-based ASOF join), if that
-- step also encloses their end.
CREATE VIEW _iterations_device_ranges AS
WITH
  enclosed AS (
    SELECT s.range_id, d.start_ns, d.end_ns
    FROM (SELECT * FROM _iterations_device_pattern WHERE iteration IS NULL) AS d
    ASOF JOIN iterations_steps AS s ON s.global_tid = d.global_tid AND s.start_ns <= d.start_ns
    WHERE d.end_ns <= coalesce(s.end_ns, 9223372036854775807)
  )
SELECT range_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns
FROM (SELECT range_id, start_ns, end_ns FROM _iterations_numbered UNION ALL SELECT * FROM enclosed)
GROUP BY range_id;

-- Per step, the GPU projection of its numbered device ranges (overlap mode on CUDA: the work its
-- forward pass launched, where the step's own projection also holds the next step's launches).
CREATE VIEW _iterations_numbered_gpu AS
SELECT
  n.range_id,
  min(g.gpu_start_ns) AS gpu_start_ns,
  max(g.gpu_end_ns) AS gpu_end_ns,
  sum(g.gpu_op_count)::BIGINT AS gpu_op_count
FROM _iterations_numbered AS n
JOIN nvtx_gpu_projection AS g ON g.range_id = n.device_range_id
GROUP BY n.range_id;

-- Per step, the start of the first CUDA API call inside it that launched GPU work.
CREATE VIEW _iterations_first_launch AS
WITH
  launches AS (
    SELECT a.global_tid, a.start_ns, a.end_ns
    FROM cuda_api AS a
    SEMI JOIN gpu_ops AS g ON g.correlation_id = a.correlation_id AND g.global_pid = a.global_pid
  )
SELECT s.range_id, min(l.start_ns) AS start_ns
FROM launches AS l
ASOF JOIN iterations_steps AS s ON s.global_tid = l.global_tid AND s.start_ns <= l.start_ns
WHERE l.end_ns <= coalesce(s.end_ns, 9223372036854775807)
GROUP BY s.range_id;

-- Per step, its device interval: the GPU projection of the work its numbered device ranges launched,
-- else of the work launched inside it, else the span of its device-pattern ranges. host_gaps reads
-- only this (not the launch columns of `iterations`).
CREATE VIEW iterations_device AS
SELECT
  s.range_id,
  s.iteration,
  s.global_tid,
  s.global_pid,
  s.start_ns,
  s.end_ns,
  coalesce(n.gpu_start_ns, g.gpu_start_ns, d.start_ns) AS device_start_ns,
  coalesce(n.gpu_end_ns, g.gpu_end_ns, d.end_ns) AS device_end_ns,
  CASE WHEN n.range_id IS NOT NULL OR g.range_id IS NOT NULL THEN 'gpu' WHEN d.range_id IS NOT NULL THEN 'range' END
    AS device_source,
  coalesce(n.gpu_op_count, g.gpu_op_count, 0) AS gpu_op_count,
  coalesce(n.gpu_start_ns, g.gpu_start_ns) AS gpu_start_ns
FROM iterations_steps AS s
LEFT JOIN _iterations_numbered_gpu AS n ON n.range_id = s.range_id
LEFT JOIN nvtx_gpu_projection AS g ON g.range_id = s.range_id
LEFT JOIN _iterations_device_ranges AS d ON d.range_id = s.range_id;

-- One row per iteration: its host interval (the step range) and its device interval.
CREATE VIEW iterations (
  -- Iteration number: the step's int64 payload, the number in its text, or its place on its thread (mapping.iteration_from).
  iteration,
  -- Global id of the thread that ran the step range: the track on which host_gaps measures gaps.
  global_tid,
  -- Global id of that thread's process.
  global_pid,
  -- The step range (nvtx_ranges.range_id).
  step_range_id,
  -- Start of the step range, in ns since the capture started.
  host_start_ns,
  -- End of the step range; NULL when it was still open when the capture stopped.
  host_end_ns,
  -- host_end_ns - host_start_ns.
  host_dur_ns,
  -- Start of the iteration's device work: its first GPU operation (launched inside its numbered device ranges, or else inside the step), or else its first device-pattern range; NULL when it has neither.
  device_start_ns,
  -- End of the iteration's device work: its last GPU operation, or else the end of its last device-pattern range.
  device_end_ns,
  -- device_end_ns - device_start_ns.
  device_dur_ns,
  -- Where the device interval comes from: 'gpu' (GPU work it launched), 'range' (its device-pattern ranges), or NULL (neither).
  device_source,
  -- GPU operations (kernels, memcpys, memsets) it launched (inside its numbered device ranges, or else inside the step); 0 when none.
  gpu_op_count,
  -- Start of the first CUDA API call inside the step that launched GPU work; NULL without GPU work.
  first_launch_ns,
  -- device_start_ns - first_launch_ns on GPU iterations: from the first launch to the first GPU work starting; NULL otherwise.
  launch_latency_ns
) AS
SELECT
  s.iteration,
  s.global_tid,
  s.global_pid,
  s.range_id,
  s.start_ns,
  s.end_ns,
  s.end_ns - s.start_ns,
  s.device_start_ns,
  s.device_end_ns,
  s.device_end_ns - s.device_start_ns,
  s.device_source,
  s.gpu_op_count,
  f.start_ns,
  s.gpu_start_ns - f.start_ns
FROM iterations_device AS s
LEFT JOIN _iterations_first_launch AS f ON f.range_id = s.range_id
ORDER BY s.global_tid, s.start_ns, s.range_id;
