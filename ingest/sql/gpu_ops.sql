-- The stored columns of gpu_ops (dur_ns is computed by the view): read gpu_ops.
CREATE TABLE _gpu_op_rows (
  -- As gpu_ops.gpu_op_id.
  gpu_op_id BIGINT,
  -- As gpu_ops.kind.
  kind VARCHAR,
  -- As gpu_ops.start_ns.
  start_ns BIGINT,
  -- As gpu_ops.end_ns.
  end_ns BIGINT,
  -- As gpu_ops.name.
  name VARCHAR,
  -- As gpu_ops.short_name.
  short_name VARCHAR,
  -- As gpu_ops.device_id.
  device_id BIGINT,
  -- As gpu_ops.context_id.
  context_id BIGINT,
  -- As gpu_ops.stream_id.
  stream_id BIGINT,
  -- As gpu_ops.correlation_id.
  correlation_id BIGINT,
  -- As gpu_ops.global_pid.
  global_pid BIGINT,
  -- As gpu_ops.pid.
  pid BIGINT,
  -- As gpu_ops.bytes.
  bytes BIGINT,
  -- As gpu_ops.copy_kind.
  copy_kind VARCHAR,
  -- As gpu_ops.launch_type.
  launch_type VARCHAR,
  -- Position of the raw row it came from in the export's CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY or _MEMSET
  -- (by kind; nsys's tables read their values back from here by it); NULL for rows from other sources.
  export_row BIGINT
);

-- GPU operations: one row per kernel, memcpy and memset CUPTI recorded, with names resolved.
CREATE VIEW gpu_ops (
  -- Id of the operation in this database: its position by start_ns, then kind, device, stream and correlation_id; stable across re-ingests.
  gpu_op_id,
  -- 'kernel', 'memcpy' or 'memset'.
  kind,
  -- Start on the GPU, in ns since the capture session started.
  start_ns,
  -- End on the GPU, in ns since the session started.
  end_ns,
  -- end_ns - start_ns.
  dur_ns,
  -- Kernel: its demangled name (StringIds via demangledName); memcpy: '[CUDA memcpy <copy kind>]'; memset: '[CUDA memset]'.
  name,
  -- Kernel: its short name (StringIds via shortName); NULL for other kinds.
  short_name,
  -- CUDA device id.
  device_id,
  -- CUDA context id.
  context_id,
  -- CUDA stream id.
  stream_id,
  -- CUPTI correlation id of the API call that launched it, within its process (cuda_api.correlation_id).
  correlation_id,
  -- Global id of the launching process (processes.global_pid).
  global_pid,
  -- Operating-system process id of the launching process.
  pid,
  -- Bytes copied or set; NULL for kernels.
  bytes,
  -- Memcpy direction, e.g. 'Host-to-Device' (ENUM_CUDA_MEMCPY_OPER label, else the raw copyKind); NULL for other kinds.
  copy_kind,
  -- Kernel launch type, e.g. 'Regular' (ENUM_CUDA_KERNEL_LAUNCH_TYPE, spelt ENUM_CUDA_KRENEL_LAUNCH_TYPE in nsys 2022); NULL for other kinds.
  launch_type
) AS
SELECT
  r.gpu_op_id,
  r.kind,
  r.start_ns,
  r.end_ns,
  r.end_ns - r.start_ns,
  r.name,
  r.short_name,
  r.device_id,
  r.context_id,
  r.stream_id,
  r.correlation_id,
  r.global_pid,
  r.pid,
  r.bytes,
  r.copy_kind,
  r.launch_type
FROM _gpu_op_rows AS r;

-- Every GPU operation with its names resolved, by kind and raw row.
CREATE OR REPLACE TEMP VIEW _gpu_op_sources AS
WITH
  kernels AS (
    SELECT
      'kernel' AS kind, k.start, k."end", dn.value AS name, sn.value AS short_name, k.deviceId, k.contextId,
      k.streamId, k.correlationId, k.globalPid, NULL::BIGINT AS bytes, NULL::VARCHAR AS copy_kind,
      coalesce(lt.label, k.launchType::VARCHAR) AS launch_type, k._row
    FROM _raw_kernels AS k
    LEFT JOIN _raw_strings AS dn ON dn.id = k.demangledName
    LEFT JOIN _raw_strings AS sn ON sn.id = k.shortName
    LEFT JOIN _raw_enum_launch_type AS lt ON lt.id = k.launchType
  ),
  copies AS (
    SELECT
      'memcpy', m.start, m."end", '[CUDA memcpy ' || coalesce(op.label, m.copyKind::VARCHAR) || ']', NULL,
      m.deviceId, m.contextId, m.streamId, m.correlationId, m.globalPid, m.bytes,
      coalesce(op.label, m.copyKind::VARCHAR), NULL, m._row
    FROM _raw_memcpy AS m
    LEFT JOIN _raw_enum_memcpy_oper AS op ON op.id = m.copyKind
  ),
  sets AS (
    SELECT
      'memset', m.start, m."end", '[CUDA memset]', NULL, m.deviceId, m.contextId, m.streamId,
      m.correlationId, m.globalPid, m.bytes, NULL, NULL, m._row
    FROM _raw_memset AS m
  )
SELECT * FROM kernels
UNION ALL SELECT * FROM copies
UNION ALL SELECT * FROM sets;

-- Every GPU operation's gpu_op_id by kind and raw row, numbered once over the sort keys alone (not
-- the names).
CREATE OR REPLACE TEMP TABLE _gpu_op_numbered AS
WITH
  ops AS (
    SELECT 'kernel' AS kind, start, deviceId, streamId, correlationId, _row FROM _raw_kernels
    UNION ALL SELECT 'memcpy', start, deviceId, streamId, correlationId, _row FROM _raw_memcpy
    UNION ALL SELECT 'memset', start, deviceId, streamId, correlationId, _row FROM _raw_memset
  )
SELECT kind, _row, row_number() OVER (ORDER BY start, kind, deviceId, streamId, correlationId, _row) AS gpu_op_id
FROM ops;

INSERT INTO _gpu_op_rows
SELECT
  n.gpu_op_id,
  o.kind,
  o.start,
  o."end",
  o.name,
  o.short_name,
  o.deviceId,
  o.contextId,
  o.streamId,
  o.correlationId,
  o.globalPid,
  (o.globalPid >> 24) & 16777215,
  o.bytes,
  o.copy_kind,
  o.launch_type,
  o._row
FROM _gpu_op_sources AS o
JOIN _gpu_op_numbered AS n ON n.kind = o.kind AND n._row = o._row;
