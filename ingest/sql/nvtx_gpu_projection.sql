-- NVTX ranges projected onto the GPU, as Nsight's NVTX GPU projection (nsys stats report
-- nvtxgpuproj) computes them: for each range, the GPU work (kernels, memcpys, memsets) whose
-- launching CUDA API call began and ended inside the range, on the thread that started the range
-- (the call joined to its GPU work through correlation_id within one process). One row per range
-- that launched GPU work; ranges that ended on another thread are not projected, and a range still
-- open when the capture stopped is taken to end at the last NVTX timestamp.
CREATE TABLE nvtx_gpu_projection (
  -- The range (nvtx_ranges.range_id).
  range_id BIGINT,
  -- Start of the first GPU operation launched inside the range, in ns since the session started.
  gpu_start_ns BIGINT,
  -- End of the last GPU operation launched inside the range, in ns since the session started.
  gpu_end_ns BIGINT,
  -- gpu_end_ns - gpu_start_ns: the range's span on the GPU.
  gpu_dur_ns BIGINT,
  -- Number of GPU operations launched inside the range.
  gpu_op_count BIGINT,
  -- Number of API calls inside the range that launched GPU work (distinct correlation ids): what Nsight reports as NumGPUOps, where one graph launch counts once.
  launch_count BIGINT
);

INSERT INTO nvtx_gpu_projection
WITH
  trace_end AS (
    SELECT coalesce(max(greatest(start, coalesce("end", start))), 0) AS ts
    FROM _raw_nvtx
  ),
  launches AS (
    -- Each API call that launched GPU work, with the span and number of that work.
    SELECT
      a.api_id,
      a.global_tid,
      a.start_ns,
      a.end_ns,
      a.correlation_id,
      min(g.start_ns) AS gpu_start_ns,
      max(g.end_ns) AS gpu_end_ns,
      count(*) AS gpu_ops
    FROM cuda_api AS a
    JOIN gpu_ops AS g ON g.correlation_id = a.correlation_id AND g.global_pid = a.global_pid
    GROUP BY a.api_id, a.global_tid, a.start_ns, a.end_ns, a.correlation_id
  ),
  -- Thread and time packed into one HUGEINT (thread in the high 64 bits), so that "on the same
  -- thread and inside the range" is two inequalities, which DuckDB answers with a sort-based
  -- IEJoin rather than by comparing every pair of rows on a thread.
  range_keys AS (
    SELECT
      range_id,
      (global_tid::HUGEINT << 64) + start_ns AS lo,
      (global_tid::HUGEINT << 64) + coalesce(end_ns, (SELECT ts FROM trace_end)) AS hi
    FROM nvtx_ranges
    WHERE end_global_tid IS NULL OR end_global_tid = global_tid
  ),
  launch_keys AS (
    SELECT
      gpu_start_ns,
      gpu_end_ns,
      gpu_ops,
      (global_tid::HUGEINT << 64) + start_ns AS lo,
      (global_tid::HUGEINT << 64) + end_ns AS hi
    FROM launches
  )
SELECT
  r.range_id,
  min(l.gpu_start_ns),
  max(l.gpu_end_ns),
  max(l.gpu_end_ns) - min(l.gpu_start_ns),
  sum(l.gpu_ops),
  -- One launch row per API call, so this counts distinct correlation ids as Nsight does (without
  -- DISTINCT, which would turn the IEJoin into a piecewise merge join).
  count(*)
FROM range_keys AS r
JOIN launch_keys AS l ON l.lo >= r.lo AND l.hi <= r.hi
GROUP BY r.range_id
ORDER BY r.range_id;
