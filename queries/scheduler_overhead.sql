-- Scheduler overhead, from the trace: per iteration, the host time outside device work against the
-- device time, and how often host work is the larger.
--
-- @uses iterations

-- One row per iteration with a device interval.
CREATE VIEW scheduler_overhead (
  -- The track (iterations.global_tid).
  global_tid,
  -- Iteration.
  iteration,
  -- Length of the step range.
  host_dur_ns,
  -- Length of the device interval.
  device_dur_ns,
  -- Host time of the step outside its device interval: host_dur_ns minus their overlap.
  host_only_ns,
  -- True when host_only_ns > device_dur_ns: the iteration spent more time on host work than on the device.
  host_exceeds_device
) AS
WITH
  overlap AS (
    SELECT
      *,
      greatest(0, least(host_end_ns, device_end_ns) - greatest(host_start_ns, device_start_ns)) AS both_ns
    FROM iterations
    WHERE device_start_ns IS NOT NULL AND host_end_ns IS NOT NULL
  )
SELECT
  global_tid,
  iteration,
  host_dur_ns,
  device_dur_ns,
  host_dur_ns - both_ns,
  host_dur_ns - both_ns > device_dur_ns
FROM overlap
ORDER BY global_tid, host_start_ns;

-- Per track: host and device time totals and the share of iterations whose host work exceeds their device time.
CREATE VIEW scheduler_overhead_summary (
  -- The track.
  global_tid,
  -- Iterations with a device interval and a closed step range.
  iterations,
  -- Sum of host_only_ns.
  host_only_ns,
  -- Sum of device_dur_ns.
  device_ns,
  -- host_only_ns / (host_only_ns + device_ns): the host's share of iteration time.
  host_share,
  -- Iterations whose host work exceeded their device time.
  host_exceeds_device,
  -- host_exceeds_device / iterations.
  host_exceeds_device_share,
  -- Median host_only_ns.
  host_only_p50_ns,
  -- Median device_dur_ns.
  device_p50_ns
) AS
SELECT
  global_tid,
  count(*),
  sum(host_only_ns)::BIGINT,
  sum(device_dur_ns)::BIGINT,
  sum(host_only_ns) / nullif(sum(host_only_ns) + sum(device_dur_ns), 0),
  count(*) FILTER (WHERE host_exceeds_device),
  count(*) FILTER (WHERE host_exceeds_device) / count(*),
  quantile_disc(host_only_ns, 0.5),
  quantile_disc(device_dur_ns, 0.5)
FROM scheduler_overhead
GROUP BY global_tid
ORDER BY global_tid;
