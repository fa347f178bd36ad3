-- The capture this database holds: the source it was ingested from, the Nsight Systems release
-- and export schema that wrote it, and when the capture session started. One row.
CREATE TABLE capture_meta (
  -- The source given to the ingest, as an absolute path.
  source VARCHAR,
  -- Kind of that source: 'nsys-rep', 'arrow', 'arrowdir' or 'parquetdir'.
  source_kind VARCHAR,
  -- Nsight Systems version that wrote the export (EXPORT_PRODUCT_VERSION), e.g. '2022.4.2.1'.
  nsys_version VARCHAR,
  -- Export schema version, e.g. '3.25.0' (EXPORT_SCHEMA_VERSION, else its _MAJOR, _MINOR, _MICRO rows).
  export_schema_version VARCHAR,
  -- When the capture session started, in ns since the Unix epoch; every *_ns timestamp in the other tables counts from this instant.
  session_start_utc_ns BIGINT,
  -- The session start as UTC text, e.g. '2026-05-24T13:40:14'.
  session_start_utc VARCHAR,
  -- The session start in the capture machine's local time, as nsys wrote it.
  session_start_local VARCHAR
);

INSERT INTO capture_meta
WITH
  meta AS (
    SELECT name, arg_max(value, _row) AS value
    FROM _raw_export_meta
    WHERE name IS NOT NULL
    GROUP BY name
  ),
  schema_parts AS (
    SELECT
      max(CASE WHEN name = 'EXPORT_SCHEMA_VERSION_MAJOR' THEN value END) || '.'
        || max(CASE WHEN name = 'EXPORT_SCHEMA_VERSION_MINOR' THEN value END) || '.'
        || max(CASE WHEN name = 'EXPORT_SCHEMA_VERSION_MICRO' THEN value END) AS version
    FROM meta
  ),
  session AS (
    SELECT utcEpochNs, utcTime, localTime
    FROM _raw_session_start
    ORDER BY _row
    LIMIT 1
  )
SELECT
  src.source,
  src.source_kind,
  (SELECT value FROM meta WHERE name = 'EXPORT_PRODUCT_VERSION'),
  coalesce((SELECT value FROM meta WHERE name = 'EXPORT_SCHEMA_VERSION'), (SELECT version FROM schema_parts)),
  (SELECT utcEpochNs FROM session),
  (SELECT utcTime FROM session),
  (SELECT localTime FROM session)
FROM _ingest_source AS src;
