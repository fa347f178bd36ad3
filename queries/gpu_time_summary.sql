-- GPU time summary: one row per GPU, its busy and idle shares and its largest idle causes.
--
-- Notes. The idle time by kind is gpu_time_causes' added up, which is gpu_time's (the parts of each idle
-- span add up to it), so that the idle spans are computed once.
--
-- @uses gpu_time, gpu_time_causes

-- One row per GPU and process: busy and idle shares of the window, and the largest idle causes.
CREATE VIEW gpu_time_summary (
  -- CUDA device id.
  device_id,
  -- Global id of the process.
  global_pid,
  -- The capture window (gpu_time.window_ns).
  window_ns,
  -- Share of the window the GPU was busy (0 to 1).
  busy_share,
  -- Share of the window it sat idle within iterations.
  idle_within_share,
  -- Share of the window it sat idle between iterations.
  idle_between_share,
  -- Share of the window it sat idle outside iterations.
  idle_outside_share,
  -- Kind of the cause that took the most idle time (gpu_time_causes.cause_kind).
  top_cause_kind,
  -- That cause.
  top_cause,
  -- Its share of the GPU's idle time (0 to 1).
  top_cause_share,
  -- The three largest causes, each as 'cause (kind): share of idle time'.
  top_causes,
  -- The window the shares divide by (gpu_time.window_source): the profiler's span, or the GPU work's.
  window_source
) AS
WITH
  ranked AS (
    SELECT *, row_number() OVER (PARTITION BY device_id, global_pid ORDER BY idle_ns DESC, cause_kind, cause) AS position
    FROM gpu_time_causes
  ),
  tops AS (
    SELECT device_id, global_pid,
           any_value(cause_kind) FILTER (WHERE position = 1) AS cause_kind,
           any_value(cause) FILTER (WHERE position = 1) AS cause,
           any_value(idle_share) FILTER (WHERE position = 1) AS share,
           list(cause || ' (' || cause_kind || '): ' || round(100 * idle_share, 1)::VARCHAR || '%' ORDER BY position)
             FILTER (WHERE position <= 3) AS top_causes,
           sum(within_ns)::BIGINT AS within_ns, sum(between_ns)::BIGINT AS between_ns,
           sum(outside_ns)::BIGINT AS outside_ns
    FROM ranked
    GROUP BY ALL
  )
SELECT t.device_id, t.global_pid, t.window_ns, t.busy_ns / nullif(t.window_ns, 0),
       coalesce(c.within_ns, 0) / nullif(t.window_ns, 0), coalesce(c.between_ns, 0) / nullif(t.window_ns, 0),
       coalesce(c.outside_ns, 0) / nullif(t.window_ns, 0), c.cause_kind, c.cause, c.share, c.top_causes, t.window_source
FROM gpu_time_busy AS t
LEFT JOIN tops AS c USING (device_id, global_pid)
ORDER BY t.device_id, t.global_pid;
