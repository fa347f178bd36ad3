-- PyTorch profiler (Kineto) traces: every event of every trace file, staged for the ingest and dropped when
-- it ends. Times become integer ns: `ts` and `dur` are microseconds with up to three decimals (the ns
-- digits, where the trace has them), read as DECIMAL so that no digit is lost on the way (a DOUBLE
-- holds 16 significant digits; 1712195495519689.047 has 19). Of `args` only what the normalized tables
-- need is taken, with one json_extract per event that needs any; a value of another type than
-- expected (a stream given as text, a correlation id of 1.5) is NULL, not an error, and never rounded
-- to another id. cpu_op events keep their args whole.
-- A pid or tid is read where it is the same integer in any form (7, 7.0, "7"); `left_out` marks the
-- events of the kinds the tables read that cannot be placed (kineto_checks.py deletes them, with a note).

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
  args JSON,
  -- Why the event is left out ('time': no ts, or no dur; 'negative': a negative dur; or the pid or tid
  -- that is not an integer, e.g. 'pid 7.5'); NULL for the events kept.
  left_out VARCHAR
);

-- A JSON value as the integer it is (7, -7, 7.0, 7e0, "7"); NULL for other values (7.5, "seven", true,
-- one past 64 bits), where try_cast would round a number and read true as 1.
CREATE TEMP MACRO _kineto_int(j) AS CASE json_type(j)
  WHEN 'UBIGINT' THEN try_cast(j AS BIGINT)
  WHEN 'BIGINT' THEN j::BIGINT
  WHEN 'DOUBLE' THEN CASE WHEN j::DOUBLE = trunc(j::DOUBLE) AND abs(j::DOUBLE) < 9.2e18 THEN j::DOUBLE::BIGINT END
  WHEN 'VARCHAR' THEN CASE WHEN regexp_full_match(j ->> '$', '-?[0-9]+') THEN try_cast(j ->> '$' AS BIGINT) END
END;

-- A time in microseconds as integer ns, within the ±2^62 ns that times are kept in (checks.TIME_LIMIT_NS).
CREATE TEMP MACRO _kineto_ns(us, what) AS CASE
  WHEN us IS NULL THEN NULL
  WHEN abs(us) < 4611686018427387.904 THEN (us * 1000)::BIGINT
  ELSE error(what || ' ' || us::VARCHAR || ' us is past ±2^62 ns (146 years), the range of times itertrace stores')
END;

-- One trace file's events (parameters: the events file, its source number).
INSERT INTO _kineto_events
WITH
  events AS (
    SELECT
      ph, lower(cat) AS cat, name, pid, tid, _kineto_int(pid) AS pid_n, _kineto_int(tid) AS tid_n, ts, dur, id, args,
      -- the kinds the tables read: complete events of the CPU and GPU categories, instants on a thread
      (ph = 'X' AND lower(cat) IN ('user_annotation', 'cpu_op', 'operator', 'cuda_runtime', 'runtime', 'cuda_driver',
                                   'driver', 'kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset',
                                   'gpu_user_annotation'))
        OR (ph IN ('i', 'I') AND coalesce(lower(cat), '') NOT LIKE 'itertrace%' AND coalesce(s, '') <> 'g') AS is_read,
      ph IN ('i', 'I') OR lower(cat) NOT IN ('kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset',
                                             'gpu_user_annotation') AS on_thread,
      CASE WHEN ph IN ('M', 'i', 'I') OR lower(cat) IN (
          'kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset', 'memset', 'cuda_runtime', 'runtime', 'cuda_driver',
          'driver', 'user_annotation', 'gpu_user_annotation')
        THEN json_extract(args, ['$.correlation', '$."correlation id"', '$.device', '$.stream', '$.context',
                                 '$.bytes', '$."External id"', '$."external id"', '$.name', '$."Concrete Inputs"',
                                 '$.domain'])
      END AS a
    FROM read_json(?, format = 'array', columns = {
      'ph': 'VARCHAR', 'cat': 'VARCHAR', 'name': 'VARCHAR', 'pid': 'JSON', 'tid': 'JSON',
      'ts': 'DECIMAL(22,3)', 'dur': 'DECIMAL(22,3)', 'id': 'JSON', 'args': 'JSON', 's': 'VARCHAR'})
  )
SELECT
  ?,
  ph,
  cat,
  name,
  pid_n,
  tid_n,
  _kineto_ns(ts, 'ts'),
  _kineto_ns(dur, 'dur'),
  _kineto_int(id),
  coalesce(_kineto_int(a[1]), _kineto_int(a[2])),
  _kineto_int(a[3]),
  _kineto_int(a[4]),
  _kineto_int(a[5]),
  _kineto_int(a[6]),
  coalesce(_kineto_int(a[7]), _kineto_int(a[8])),
  a[9] ->> '$',
  -- record_function's one integer argument (torch.autograd._record_function_with_args_enter, traced with
  -- record_shapes): the range's payload, as an NVTX range's int64 payload is
  CASE WHEN json_array_length(a[10]) = 1 THEN try_cast(a[10] ->> '$[0]' AS BIGINT) END,
  a[11] ->> '$',
  CASE WHEN cat IN ('cpu_op', 'operator') THEN args END,
  CASE WHEN is_read THEN
    CASE
      WHEN ts IS NULL OR (ph = 'X' AND dur IS NULL) THEN 'time'
      WHEN dur < 0 AND ph = 'X' THEN 'negative'
      WHEN on_thread AND pid IS NULL THEN 'no pid'
      WHEN on_thread AND pid_n IS NULL THEN 'pid ' || pid::VARCHAR
      WHEN on_thread AND tid IS NULL THEN 'no tid'
      WHEN on_thread AND tid_n IS NULL THEN 'tid ' || tid::VARCHAR
    END
  END
FROM events
WHERE ph IS NOT NULL;
