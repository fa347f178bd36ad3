-- PyTorch profiler (Kineto) traces: every event of every trace file, staged for the ingest and dropped when
-- it ends. Times become integer ns: `ts` and `dur` are microseconds with up to three decimals (the ns
-- digits, where the trace has them), read as DECIMAL so that no digit is lost on the way (a DOUBLE
-- holds 16 significant digits; 1712195495519689.047 has 19). Of `args` only what the normalized tables
-- need is taken, with one json_extract per event that needs any; a value of another type than
-- expected (a stream given as text) is NULL, not an error. cpu_op events keep their args whole.

CREATE TEMP TABLE _kineto_events (
  source_no INTEGER,
  ph VARCHAR,
  cat VARCHAR,
  name VARCHAR,
  pid BIGINT,
  tid BIGINT,
  ts_ns BIGINT,
  dur_ns BIGINT,
  flow_id BIGINT,
  correlation_id BIGINT,
  device_id BIGINT,
  stream_id BIGINT,
  context_id BIGINT,
  bytes BIGINT,
  external_id BIGINT,
  arg_name VARCHAR,
  int64_value BIGINT,
  domain VARCHAR,
  args JSON
);

-- One trace file's events (parameters: the events file, its source number).
INSERT INTO _kineto_events
WITH
  events AS (
    SELECT
      ph, lower(cat) AS cat, name, pid, tid, ts, dur, id, args,
      CASE WHEN ph IN ('M', 'i', 'I') OR lower(cat) IN (
          'kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset', 'cuda_runtime', 'runtime', 'cuda_driver',
          'driver', 'user_annotation', 'gpu_user_annotation')
        THEN json_extract(args, ['$.correlation', '$."correlation id"', '$.device', '$.stream', '$.context',
                                 '$.bytes', '$."External id"', '$."external id"', '$.name', '$."Concrete Inputs"',
                                 '$.domain'])
      END AS a
    FROM read_json(?, format = 'array', columns = {
      'ph': 'VARCHAR', 'cat': 'VARCHAR', 'name': 'VARCHAR', 'pid': 'JSON', 'tid': 'JSON',
      'ts': 'DECIMAL(22,3)', 'dur': 'DECIMAL(22,3)', 'id': 'JSON', 'args': 'JSON'})
  )
SELECT
  ?,
  ph,
  cat,
  name,
  try_cast(pid AS BIGINT),
  try_cast(tid AS BIGINT),
  (ts * 1000)::BIGINT,
  (dur * 1000)::BIGINT,
  try_cast(id AS BIGINT),
  coalesce(try_cast(a[1] AS BIGINT), try_cast(a[2] AS BIGINT)),
  try_cast(a[3] AS BIGINT),
  try_cast(a[4] AS BIGINT),
  try_cast(a[5] AS BIGINT),
  try_cast(a[6] AS BIGINT),
  coalesce(try_cast(a[7] AS BIGINT), try_cast(a[8] AS BIGINT)),
  a[9] ->> '$',
  -- record_function's one integer argument (torch.autograd._record_function_with_args_enter, traced with
  -- record_shapes): the range's payload, as an NVTX range's int64 payload is
  CASE WHEN json_array_length(a[10]) = 1 THEN try_cast(a[10] ->> '$[0]' AS BIGINT) END,
  a[11] ->> '$',
  CASE WHEN cat IN ('cpu_op', 'operator') THEN args END
FROM events
WHERE ph IS NOT NULL;
