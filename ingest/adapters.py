"""Temporary views that give the normalizing SQL one fixed shape of every raw nsys table it reads.

Notes
-----
Export schemas differ by version: a table is absent when it had no rows, columns come and go
(`binaryData`, `greenContextId`), and enum tables are renamed (`ENUM_CUDA_KRENEL_LAUNCH_TYPE` in
2022.4 became `ENUM_CUDA_KERNEL_LAUNCH_TYPE`). Each view here selects the listed columns from the
first candidate table that exists, casting each to the listed type and filling a missing column
with NULL; when no candidate exists the view is empty. `_row` is the row's position in the raw
table, the last tie-break wherever an order must be total for the database to be reproducible, and
the key by which `nsys_store` finds which normalized row each raw row became.
"""
from __future__ import annotations

from dataclasses import dataclass

import duckdb

from itertrace.ingest.loader import quote


@dataclass(frozen=True)
class RawView:
    """A temporary view over the first raw table of `candidates` that exists, with fixed columns."""

    view: str
    candidates: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (raw column name, DuckDB type)


_GPU_COMMON = (("start", "BIGINT"), ("end", "BIGINT"), ("deviceId", "BIGINT"), ("contextId", "BIGINT"),
               ("streamId", "BIGINT"), ("correlationId", "BIGINT"), ("globalPid", "BIGINT"))
_ENUM = (("id", "BIGINT"), ("name", "VARCHAR"), ("label", "VARCHAR"))

RAW_VIEWS = (
    RawView("_raw_strings", ("StringIds",), (("id", "BIGINT"), ("value", "VARCHAR"))),
    RawView("_raw_nvtx", ("NVTX_EVENTS",), (
        ("start", "BIGINT"), ("end", "BIGINT"), ("eventType", "BIGINT"), ("rangeId", "BIGINT"),
        ("category", "BIGINT"), ("color", "BIGINT"), ("text", "VARCHAR"), ("globalTid", "BIGINT"),
        ("endGlobalTid", "BIGINT"), ("textId", "BIGINT"), ("domainId", "BIGINT"), ("uint64Value", "BIGINT"),
        ("int64Value", "BIGINT"), ("doubleValue", "DOUBLE"), ("uint32Value", "BIGINT"), ("int32Value", "BIGINT"),
        ("floatValue", "DOUBLE"), ("jsonTextId", "BIGINT"), ("jsonText", "VARCHAR"))),
    RawView("_raw_thread_names", ("ThreadNames",), (("nameId", "BIGINT"), ("priority", "BIGINT"), ("globalTid", "BIGINT"))),
    RawView("_raw_processes", ("PROCESSES",), (("globalPid", "BIGINT"), ("pid", "BIGINT"), ("name", "VARCHAR"))),
    RawView("_raw_runtime", ("CUPTI_ACTIVITY_KIND_RUNTIME",), (
        ("start", "BIGINT"), ("end", "BIGINT"), ("eventClass", "BIGINT"), ("globalTid", "BIGINT"),
        ("correlationId", "BIGINT"), ("nameId", "BIGINT"), ("returnValue", "BIGINT"))),
    RawView("_raw_kernels", ("CUPTI_ACTIVITY_KIND_KERNEL",), (
        *_GPU_COMMON, ("demangledName", "BIGINT"), ("shortName", "BIGINT"), ("launchType", "BIGINT"))),
    RawView("_raw_memcpy", ("CUPTI_ACTIVITY_KIND_MEMCPY",), (*_GPU_COMMON, ("bytes", "BIGINT"), ("copyKind", "BIGINT"))),
    RawView("_raw_memset", ("CUPTI_ACTIVITY_KIND_MEMSET",), (*_GPU_COMMON, ("bytes", "BIGINT"))),
    RawView("_raw_export_meta", ("META_DATA_EXPORT", "EXPORT_META_DATA"), (("name", "VARCHAR"), ("value", "VARCHAR"))),
    RawView("_raw_session_start", ("TARGET_INFO_SESSION_START_TIME",), (
        ("utcEpochNs", "BIGINT"), ("utcTime", "VARCHAR"), ("localTime", "VARCHAR"))),
    RawView("_raw_analysis", ("ANALYSIS_DETAILS",), (("duration", "BIGINT"), ("startTime", "BIGINT"), ("stopTime", "BIGINT"))),
    RawView("_raw_enum_event_class", ("ENUM_NSYS_EVENT_CLASS",), _ENUM),
    RawView("_raw_enum_memcpy_oper", ("ENUM_CUDA_MEMCPY_OPER",), _ENUM),
    RawView("_raw_enum_launch_type", ("ENUM_CUDA_KERNEL_LAUNCH_TYPE", "ENUM_CUDA_KRENEL_LAUNCH_TYPE"), _ENUM),
)


def schema_relations(con: duckdb.DuckDBPyConnection, schema: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The raw tables in `schema` as relations with a column `_row`, and their columns, for
    `create_raw_views_over`."""
    present = _columns_by_table(con, schema)
    relations = {table: f"(SELECT *, rowid AS _row FROM {quote(schema)}.{quote(table)})" for table in present}
    return relations, present


def create_raw_views_over(con: duckdb.DuckDBPyConnection, relations: dict[str, str],
                          columns: dict[str, dict[str, str]], views: tuple[RawView, ...] = RAW_VIEWS) -> None:
    """Create every view of `views` over `relations` (table name -> SQL relation with a column `_row`).

    `columns` maps each table to its columns, lower-case name -> name as spelt.
    """
    for spec in views:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {spec.view} AS {_select(spec, relations, columns)}")


def _select(spec: RawView, relations: dict[str, str], present: dict[str, dict[str, str]]) -> str:
    table = next((present_name for name in spec.candidates
                  if (present_name := _match(name, present)) is not None), None)
    if table is None:
        columns = ", ".join(f"CAST(NULL AS {kind}) AS {quote(name)}" for name, kind in spec.columns)
        return f"SELECT {columns}, CAST(NULL AS BIGINT) AS _row WHERE false"
    have = present[table]
    columns = ", ".join(
        f"CAST({quote(have[name.lower()])} AS {kind}) AS {quote(name)}" if name.lower() in have
        else f"CAST(NULL AS {kind}) AS {quote(name)}"
        for name, kind in spec.columns
    )
    return f"SELECT {columns}, _row FROM {relations[table]}"


def _match(name: str, present: dict[str, dict[str, str]]) -> str | None:
    return next((table for table in present if table.lower() == name.lower()), None)


def _columns_by_table(con: duckdb.DuckDBPyConnection, schema: str) -> dict[str, dict[str, str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        "WHERE schema_name = ? AND database_name = current_database() ORDER BY table_name, column_index",
        [schema],
    ).fetchall()
    tables: dict[str, dict[str, str]] = {}
    for table, column in rows:
        tables.setdefault(table, {})[column.lower()] = column
    return tables
