-- GPU time by cause: per GPU, the idle time each host activity took (gpu_idle_parts added up by cause).
--
-- @uses gpu_idle_parts

-- Per GPU and cause, the idle time it took: what the host was doing while each GPU sat idle.
CREATE VIEW gpu_time_causes (
  -- CUDA device id.
  device_id,
  -- Global id of the process.
  global_pid,
  -- gpu_idle_parts.cause_kind.
  cause_kind,
  -- gpu_idle_parts.cause.
  cause,
  -- Idle time with this cause.
  idle_ns,
  -- idle_ns as a share of the GPU's idle time (0 to 1).
  idle_share,
  -- Of it, idle time within iterations.
  within_ns,
  -- Of it, idle time between iterations.
  between_ns,
  -- Of it, idle time outside iterations.
  outside_ns,
  -- Idle spans with some time of this cause.
  spans
) AS
WITH
  causes AS (
    SELECT device_id, global_pid, cause_kind, cause, sum(dur_ns)::BIGINT AS idle_ns,
           sum(dur_ns) FILTER (WHERE kind = 'within')::BIGINT AS within_ns,
           sum(dur_ns) FILTER (WHERE kind = 'between')::BIGINT AS between_ns,
           sum(dur_ns) FILTER (WHERE kind = 'outside')::BIGINT AS outside_ns,
           count(*) FILTER (WHERE dur_ns > 0) AS spans
    FROM gpu_idle_parts_unsorted
    GROUP BY ALL
  )
SELECT device_id, global_pid, cause_kind, cause, idle_ns,
       idle_ns / nullif(sum(idle_ns) OVER (PARTITION BY device_id, global_pid), 0),
       coalesce(within_ns, 0), coalesce(between_ns, 0), coalesce(outside_ns, 0), spans
FROM causes
WHERE idle_ns > 0
ORDER BY device_id, global_pid, idle_ns DESC, cause_kind, cause;
