-- The stored columns of cuda_api (the others are computed or looked up by the view): read cuda_api.
CREATE TABLE _cuda_api_rows (
  -- As cuda_api.api_id.
  api_id BIGINT,
  -- As cuda_api.start_ns.
  start_ns BIGINT,
  -- As cuda_api.end_ns.
  end_ns BIGINT,
  -- As cuda_api.name.
  name VARCHAR,
  -- As cuda_api.event_class.
  event_class BIGINT,
  -- As cuda_api.event_class_name.
  event_class_name VARCHAR,
  -- As cuda_api.global_tid.
  global_tid BIGINT,
  -- As cuda_api.correlation_id.
  correlation_id BIGINT,
  -- As cuda_api.return_value.
  return_value BIGINT,
  -- Position of the raw row it came from in the export's CUPTI_ACTIVITY_KIND_RUNTIME, by which
  -- nsys.CUPTI_ACTIVITY_KIND_RUNTIME reads its values back from here; NULL for rows from other sources.
  export_row BIGINT
);

-- CUDA API calls: one row per runtime or driver API call nsys traced (CUPTI_ACTIVITY_KIND_RUNTIME),
-- with the function name resolved. Backtrace rows (eventClass 67), a second row some nsys versions
-- write per call, are left out.
-- Stored are the values only a call has (_cuda_api_rows); its length, process, pid and tid are
-- computed or looked up (threads) here.
CREATE VIEW cuda_api (
  -- Id of the call in this database: its position by start_ns, then global_tid, then correlation_id; stable across re-ingests.
  api_id,
  -- Start of the call, in ns since the capture session started.
  start_ns,
  -- End of the call, in ns since the session started.
  end_ns,
  -- end_ns - start_ns.
  dur_ns,
  -- API function name as nsys records it, e.g. 'cudaLaunchKernel_v7000' (StringIds via nameId).
  name,
  -- nsys event class of the call: 0 CUDA runtime, 1 CUDA driver (ENUM_NSYS_EVENT_CLASS).
  event_class,
  -- Label of event_class, e.g. 'CUDA runtime'; NULL where the export has no ENUM_NSYS_EVENT_CLASS.
  event_class_name,
  -- Global id of the calling thread (threads.global_tid).
  global_tid,
  -- Global id of the calling process (processes.global_pid).
  global_pid,
  -- Operating-system process id.
  pid,
  -- Operating-system thread id.
  tid,
  -- CUPTI correlation id: within one process, the GPU work this call launched has the same id (gpu_ops.correlation_id).
  correlation_id,
  -- The call's return code; 0 is success.
  return_value
) AS
SELECT
  a.api_id,
  a.start_ns,
  a.end_ns,
  a.end_ns - a.start_ns,
  a.name,
  a.event_class,
  a.event_class_name,
  a.global_tid,
  t.global_pid,
  t.pid,
  t.tid,
  a.correlation_id,
  a.return_value
FROM _cuda_api_rows AS a
LEFT JOIN threads AS t ON t.global_tid = a.global_tid;

-- Every API call's api_id by raw row, numbered once over the sort keys alone.
CREATE OR REPLACE TEMP TABLE _cuda_api_numbered AS
SELECT _row, row_number() OVER (ORDER BY start, globalTid, correlationId, _row) AS api_id
FROM _raw_runtime
WHERE eventClass IS DISTINCT FROM 67;

INSERT INTO _cuda_api_rows
SELECT
  n.api_id,
  r.start,
  r."end",
  s.value,
  r.eventClass,
  ec.label,
  r.globalTid,
  r.correlationId,
  r.returnValue,
  r._row
FROM _raw_runtime AS r
JOIN _cuda_api_numbered AS n ON n._row = r._row
LEFT JOIN _raw_strings AS s ON s.id = r.nameId
LEFT JOIN _raw_enum_event_class AS ec ON ec.id = r.eventClass;
