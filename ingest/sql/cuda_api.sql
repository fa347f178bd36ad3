-- CUDA API calls: one row per runtime or driver API call nsys traced (CUPTI_ACTIVITY_KIND_RUNTIME),
-- with the function name resolved. Backtrace rows (eventClass 67), a second row some nsys versions
-- write per call, are left out.
CREATE TABLE cuda_api (
  -- Id of the call in this database: its position by start_ns, then global_tid, then correlation_id; stable across re-ingests.
  api_id BIGINT,
  -- Start of the call, in ns since the capture session started.
  start_ns BIGINT,
  -- End of the call, in ns since the session started.
  end_ns BIGINT,
  -- end_ns - start_ns.
  dur_ns BIGINT,
  -- API function name as nsys records it, e.g. 'cudaLaunchKernel_v7000' (StringIds via nameId).
  name VARCHAR,
  -- nsys event class of the call: 0 CUDA runtime, 1 CUDA driver (ENUM_NSYS_EVENT_CLASS).
  event_class BIGINT,
  -- Label of event_class, e.g. 'CUDA runtime'; NULL where the export has no ENUM_NSYS_EVENT_CLASS.
  event_class_name VARCHAR,
  -- Global id of the calling thread (threads.global_tid).
  global_tid BIGINT,
  -- Global id of the calling process (processes.global_pid).
  global_pid BIGINT,
  -- Operating-system process id.
  pid BIGINT,
  -- Operating-system thread id.
  tid BIGINT,
  -- CUPTI correlation id: within one process, the GPU work this call launched has the same id (gpu_ops.correlation_id).
  correlation_id BIGINT,
  -- The call's return code; 0 is success.
  return_value BIGINT
);

-- Every API call's api_id by raw row, numbered once over the sort keys alone; also read by nsys_store.
CREATE OR REPLACE TEMP TABLE _cuda_api_numbered AS
SELECT _row, row_number() OVER (ORDER BY start, globalTid, correlationId, _row) AS api_id
FROM _raw_runtime
WHERE eventClass IS DISTINCT FROM 67;

INSERT INTO cuda_api
SELECT
  n.api_id,
  r.start,
  r."end",
  r."end" - r.start,
  s.value,
  r.eventClass,
  ec.label,
  r.globalTid,
  (r.globalTid >> 24) << 24,
  (r.globalTid >> 24) & 16777215,
  r.globalTid & 16777215,
  r.correlationId,
  r.returnValue
FROM _raw_runtime AS r
JOIN _cuda_api_numbered AS n ON n._row = r._row
LEFT JOIN _raw_strings AS s ON s.id = r.nameId
LEFT JOIN _raw_enum_event_class AS ec ON ec.id = r.eventClass
ORDER BY n.api_id;
