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

-- Each API call that launched GPU work, with the span and number of that work; dropped when the
-- ingest ends.
CREATE OR REPLACE TEMP TABLE _gpu_launches AS
SELECT
  a.api_id,
  a.global_tid,
  a.start_ns,
  a.end_ns,
  min(g.start_ns) AS gpu_start_ns,
  max(g.end_ns) AS gpu_end_ns,
  count(*) AS gpu_ops
FROM _cuda_api_rows AS a  -- cuda_api's stored columns; a call's process is its thread's, bits 24 and up
JOIN gpu_ops AS g ON g.correlation_id = a.correlation_id AND g.global_pid = (a.global_tid >> 24) << 24
GROUP BY a.api_id, a.global_tid, a.start_ns, a.end_ns;

-- Push/pop ranges on threads whose ranges form a stack, and the calls of non-zero length on those
-- threads, are matched by walking up the nesting (ingest/projection.py: _nvtx_projection_walked,
-- on the threads in _nvtx_walk_threads); the rest by an interval join here.
INSERT INTO nvtx_gpu_projection
WITH
  trace_end AS (
    SELECT coalesce(max(greatest(start, coalesce("end", start))), 0) AS ts
    FROM _raw_nvtx
  ),
  -- Thread and time packed into one HUGEINT (thread in the high 64 bits), so that "on the same
  -- thread and inside the range" is two inequalities, which DuckDB answers with a sort-based
  -- IEJoin rather than by comparing every pair of rows on a thread.
  range_keys AS (
    SELECT
      r.range_id,
      r.depth IS NOT NULL AND w.global_tid IS NOT NULL AS walked,
      (r.global_tid::HUGEINT << 64) + r.start_ns AS lo,
      (r.global_tid::HUGEINT << 64) + coalesce(r.end_ns, (SELECT ts FROM trace_end)) AS hi
    FROM _nvtx_range_rows AS r  -- nvtx_ranges' stored columns: push/pop ranges have a depth
    LEFT JOIN _nvtx_walk_threads AS w USING (global_tid)
    WHERE (r.end_global_tid IS NULL OR r.end_global_tid = r.global_tid)
      -- Only the ranges the walk leaves, and those of the walk's threads with calls of zero length:
      -- the join sorts every range it is given, even for no call.
      AND (r.depth IS NULL OR w.global_tid IS NULL
           OR r.global_tid IN (SELECT global_tid FROM _gpu_launches WHERE end_ns = start_ns))
      AND r.global_tid IN (SELECT global_tid FROM _gpu_launches)
  ),
  launch_keys AS (
    SELECT
      gpu_start_ns,
      gpu_end_ns,
      gpu_ops,
      end_ns = start_ns AS zero_length,
      (global_tid::HUGEINT << 64) + start_ns AS lo,
      (global_tid::HUGEINT << 64) + end_ns AS hi
    FROM _gpu_launches
  ),
  joined AS (
    -- Ranges the walk does not take, with every call; the walk's ranges with its calls of zero length.
    SELECT r.range_id, min(l.gpu_start_ns) AS gpu_start_ns, max(l.gpu_end_ns) AS gpu_end_ns,
           sum(l.gpu_ops) AS gpu_ops, count(*) AS launches
    FROM (SELECT * FROM range_keys WHERE NOT walked) AS r
    JOIN launch_keys AS l ON l.lo >= r.lo AND l.hi <= r.hi
    GROUP BY r.range_id
    UNION ALL
    SELECT r.range_id, min(l.gpu_start_ns), max(l.gpu_end_ns), sum(l.gpu_ops), count(*)
    FROM (SELECT * FROM range_keys WHERE walked) AS r
    JOIN (SELECT * FROM launch_keys WHERE zero_length) AS l ON l.lo >= r.lo AND l.hi <= r.hi
    GROUP BY r.range_id
    UNION ALL
    SELECT * FROM _nvtx_projection_walked
  )
SELECT
  range_id,
  min(gpu_start_ns),
  max(gpu_end_ns),
  max(gpu_end_ns) - min(gpu_start_ns),
  sum(gpu_ops),
  -- One launch row per API call, so this counts distinct correlation ids as Nsight does.
  sum(launches)
FROM joined
GROUP BY range_id
ORDER BY range_id;
