-- The span the profiler itself recorded, per process: where it is known, the window over which the
-- capture saw everything (a GPU idle in it was idle, not unobserved). One row per process and source
-- of the span; a process whose capture records none has no row.
CREATE TABLE capture_spans (
  -- The process (processes.global_pid).
  global_pid BIGINT,
  -- Start of the span, in ns on the clock of every other table.
  start_ns BIGINT,
  -- End of the span, in ns.
  end_ns BIGINT,
  -- Where the span comes from: 'kineto trace span' (the PyTorch profiler's own Trace event, `PyTorch Profiler (N)`: from the start to the stop of its recording, for every process of the file), 'kineto profiler steps' (the first `ProfilerStep#N` annotation's start to the last one's end on the process, where the profiler ran with a schedule), or 'nsys collection' (ANALYSIS_DETAILS: what nsys collected, from the session's time 0 for its duration; with --capture-range, the capture range; otherwise the whole session from the application's launch).
  source VARCHAR
);

-- nsys: the collection, for every process (one span for the whole capture).
INSERT INTO capture_spans
SELECT p.global_pid, 0, a.duration, 'nsys collection'
FROM processes AS p
CROSS JOIN (SELECT duration FROM _raw_analysis WHERE duration IS NOT NULL ORDER BY _row LIMIT 1) AS a
ORDER BY p.global_pid;
