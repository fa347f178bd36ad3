"""What an nsys export must hold to be ingested, checked before the normalized tables are built.

nsys writes only the tables that have rows, and its columns differ by export version, so an absent
table or column is usually fine (the normalized table comes out empty, or the column NULL). What is
not fine, and is refused with one line naming the file, table and column:

- an Arrow export (one file of concatenated streams) without the tables every export holds: its
  metadata (EXPORT_META_DATA or META_DATA_EXPORT) and PROCESSES, which nsys writes last; a file cut at
  a stream boundary is otherwise whole Arrow;
- a table file without columns, two tables whose names differ only in case (DuckDB's names do not),
  a table name that is not UTF-8, a column with no name, two columns whose names differ only in case;
- a table that present rows refer to and that is absent or holds no rows (StringIds, when ids point
  into it), and an id given twice in a table of names (StringIds, the ENUM tables): every row joined
  to it would come out twice;
- a column the normalized tables cannot do without, absent or NULL in every row (a range's start, a
  kernel's end, an event's type), or one of a type other than nsys writes (text for a time, a list for
  a thread id);
- a time (the start and end of ranges, runtime calls and GPU work) past ±2^62 ns, within which any two
  times differ by a 64-bit integer, and a range, call or GPU operation that ends before it starts.

Arrow IPC carries no checksum: flipped bits inside a value are not found.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from itertrace.errors import UserError

if TYPE_CHECKING:
    import pyarrow as pa

INT, TEXT, NUMBER = "an integer", "text", "a number"
_GPU = {"start": INT, "end": INT, "deviceId": INT, "contextId": INT, "streamId": INT, "correlationId": INT,
        "globalPid": INT}
_ENUM = {"id": INT, "name": TEXT, "label": TEXT}
# The raw columns the normalized tables read, with the kind each must be (ingest/sql/*.sql, adapters.py).
READ_COLUMNS: dict[str, dict[str, str]] = {
    "StringIds": {"id": INT, "value": TEXT},
    "NVTX_EVENTS": {"start": INT, "end": INT, "eventType": INT, "rangeId": INT, "category": INT, "color": INT,
                    "text": TEXT, "globalTid": INT, "endGlobalTid": INT, "textId": INT, "domainId": INT,
                    "uint64Value": INT, "int64Value": INT, "doubleValue": NUMBER, "uint32Value": INT,
                    "int32Value": INT, "floatValue": NUMBER, "jsonTextId": INT, "jsonText": TEXT},
    "ThreadNames": {"nameId": INT, "priority": INT, "globalTid": INT},
    "PROCESSES": {"globalPid": INT, "pid": INT, "name": TEXT},
    "CUPTI_ACTIVITY_KIND_RUNTIME": {"start": INT, "end": INT, "eventClass": INT, "globalTid": INT,
                                    "correlationId": INT, "nameId": INT, "returnValue": INT},
    "CUPTI_ACTIVITY_KIND_KERNEL": {**_GPU, "demangledName": INT, "shortName": INT, "launchType": INT},
    "CUPTI_ACTIVITY_KIND_MEMCPY": {**_GPU, "bytes": INT, "copyKind": INT},
    "CUPTI_ACTIVITY_KIND_MEMSET": {**_GPU, "bytes": INT},
    "META_DATA_EXPORT": {"name": TEXT, "value": TEXT},
    "EXPORT_META_DATA": {"name": TEXT, "value": TEXT},
    "TARGET_INFO_SESSION_START_TIME": {"utcEpochNs": INT, "utcTime": TEXT, "localTime": TEXT},
    "ENUM_NSYS_EVENT_CLASS": _ENUM, "ENUM_CUDA_MEMCPY_OPER": _ENUM, "ENUM_CUDA_KERNEL_LAUNCH_TYPE": _ENUM,
    "ENUM_CUDA_KRENEL_LAUNCH_TYPE": _ENUM,
}
# Columns without which a table's rows mean nothing; each must be there, and not NULL in every row.
REQUIRED: dict[str, tuple[str, ...]] = {
    "StringIds": ("id", "value"),
    "NVTX_EVENTS": ("start", "eventType", "globalTid"),
    "ThreadNames": ("nameId", "globalTid"),
    "PROCESSES": ("globalPid", "pid"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId"),
    **{f"CUPTI_ACTIVITY_KIND_{kind}": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
       for kind in ("KERNEL", "MEMCPY", "MEMSET")},
}
# Ids into StringIds: (table, column).
STRING_REFERENCES = (("NVTX_EVENTS", "textId"), ("ThreadNames", "nameId"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"),
                     ("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName"), ("CUPTI_ACTIVITY_KIND_KERNEL", "shortName"))
METADATA_TABLES = ("EXPORT_META_DATA", "META_DATA_EXPORT")
LAST_TABLE = "PROCESSES"  # nsys writes it last, and every capture has a process
RANGE_TYPES = (59, 60, 70, 71)  # push/pop and start/end ranges (70, 71: their NVTXT twins): they have an end
PUSH_POP_TYPES = (59, 70)
# Tables of names: each id names one row, and the normalized tables join to them by id.
ID_TABLES = ("StringIds", "ENUM_NSYS_EVENT_CLASS", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_KERNEL_LAUNCH_TYPE",
             "ENUM_CUDA_KRENEL_LAUNCH_TYPE")
# Tables whose rows are intervals in time (start, end), and which of their rows are: NVTX_EVENTS' ranges.
TIMED = {"NVTX_EVENTS": f"eventType IN {RANGE_TYPES}", "CUPTI_ACTIVITY_KIND_RUNTIME": "true",
         **{f"CUPTI_ACTIVITY_KIND_{kind}": "true" for kind in ("KERNEL", "MEMCPY", "MEMSET")}}
# Times are kept within ±2^62 ns (146 years): any two then differ by a 64-bit integer, so that durations,
# gaps and sums of a few of them never overflow a BIGINT.
TIME_LIMIT_NS = 2**62
TIME_RANGE = "±2^62 ns (146 years), the range of times itertrace stores"
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                  "UBIGINT", "UHUGEINT", '"NULL"')


def table_name(raw: bytes | None, path: Path, offset: int) -> str:
    """The `table_name` metadata of the stream at `offset` of an Arrow export, as text."""
    if not raw:
        raise UserError(f"{path}: stream at byte {offset} has no table_name metadata; not an nsys Arrow export")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: stream at byte {offset} has a table_name that is not UTF-8 ({raw[:40]!r})") from None


def check_table(name: str, file: Path, schema: pa.Schema, seen: Iterable[str]) -> None:
    """A table as it is listed: it has columns, and no table before it has its name in any case."""
    if not len(schema):
        raise UserError(f"{file}: table {name} has no columns")
    columns: dict[str, str] = {}
    for column in schema.names:
        if not column:
            raise UserError(f"{file}: table {name} has a column with no name")
        if (other := columns.get(column.lower())) is not None:
            both = (f"two columns named {column}" if other == column
                    else f"columns {other} and {column}, one name to DuckDB")
            raise UserError(f"{file}: table {name} has {both}")
        columns[column.lower()] = column
    for other in seen:
        if other.lower() == name.lower():
            same = "appears twice" if other == name else f"and {other} are one name to DuckDB"
            raise UserError(f"{file}: table {name} {same}")


def check_arrow_export(path: Path, names: list[str]) -> None:
    """An Arrow export holds the tables every export does; else it was cut, perhaps at a stream boundary."""
    missing = [name for name in (LAST_TABLE,) if name not in names]
    if not any(name in names for name in METADATA_TABLES):
        missing.append(" or ".join(METADATA_TABLES))
    if missing:
        after = f"after its {len(names)} tables (the last {names[-1]})" if names else "before its first table"
        raise UserError(f"{path}: truncated Arrow export: it ends {after} without {' and '.join(missing)}, which "
                        f"every nsys export holds ({LAST_TABLE} comes last)")


def check_raw_tables(con: duckdb.DuckDBPyConnection, relations: dict[str, str], source: Path) -> None:
    """The raw tables of one capture (`relations`: table name -> SQL relation over it): references,
    required columns and types, before the normalized tables are built from them."""
    tables = _RawTables(con, relations)
    columns = tables.columns
    for table, reads in READ_COLUMNS.items():
        have = columns.get(table.lower())
        if have is None:
            continue
        name, types = have
        for column, kind in reads.items():
            found = types.get(column.lower())
            if found is not None and not _of_kind(found, kind):
                raise UserError(f"{source}: column {name}.{column} is {found}; nsys writes {kind} there")
        rows = tables.count(name)
        for column in REQUIRED.get(table, ()):
            if column.lower() not in types:
                raise UserError(f"{source}: table {name} has no column {column}, without which its rows mean nothing")
            if rows and not tables.count(name, f'"{column}" IS NOT NULL'):  # names match in any case
                raise UserError(f"{source}: column {name}.{column} is NULL in all {rows:,} rows")
    if "nvtx_events" in columns:
        _check_range_ends(tables, columns["nvtx_events"], source)
    strings = columns.get("stringids")
    if strings is None or not tables.count(strings[0]):
        for table, column in STRING_REFERENCES:
            have = columns.get(table.lower())
            if have and column.lower() in have[1]:
                pointing = tables.count(have[0], f'"{column}" IS NOT NULL')
                if pointing:
                    what = "no StringIds table" if strings is None else f"{strings[0]} holds no rows"
                    raise UserError(f"{source}: {what}, which {pointing:,} rows of {have[0]}.{column} "
                                    "refer to (their names would all be missing)")
    for table in ID_TABLES:
        if (have := columns.get(table.lower())) and "id" in have[1]:
            _check_unique_ids(tables, have[0], source)
    for table, intervals in TIMED.items():
        if (have := columns.get(table.lower())) and {"start", "end"} <= have[1].keys():
            _check_times(tables, have[0], intervals, source)


class _RawTables:
    """The checked tables' columns and DuckDB types ({lower-case name: (name, {lower-case column: type})}),
    and row counts, read from the relations over them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, relations: dict[str, str]) -> None:
        self.con, self.relations = con, relations
        checked = {name.lower() for name in READ_COLUMNS}
        self.columns: dict[str, tuple[str, dict[str, str]]] = {}
        for name, relation in relations.items():
            if name.lower() in checked:
                described = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
                self.columns[name.lower()] = (name, {row[0].lower(): row[1] for row in described})

    def count(self, table: str, where: str = "true") -> int:
        return self.con.execute(f"SELECT count(*) FROM {self.relations[table]} WHERE {where}").fetchall()[0][0]


def empty_tables(con: duckdb.DuckDBPyConnection, tables: Iterable[str]) -> list[str]:
    """Those of `tables` (tables or views in the main schema) that exist and hold no rows, for the closing summary."""
    present = {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND database_name = current_database() "
        "UNION ALL SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND database_name = current_database()"
    ).fetchall()}
    return [t for t in tables if t in present and not con.execute(f'SELECT count(*) FROM "{t}"').fetchall()[0][0]]


def unnamed_threads_note(con: duckdb.DuckDBPyConnection, schema: str) -> str | None:
    """A note when an nsys capture's threads have no names because its export holds no ThreadNames table."""
    tables = {(s, t.lower()) for s, t in con.execute(  # nsys's small tables are views over one table
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "UNION ALL SELECT schema_name, view_name FROM duckdb_views() WHERE database_name = current_database()"
    ).fetchall()}
    if ("main", "threads") not in tables or (schema, "threadnames") in tables or all(s != schema for s, _ in tables):
        return None  # no threads, or their names, or no nsys capture (a PyTorch profiler trace names threads itself)
    threads, named = con.execute("SELECT count(*), count(name) FROM threads").fetchall()[0]
    if not threads or named:
        return None
    return (f"the export holds no ThreadNames table: its {threads:,} thread{'s have no names' if threads > 1 else ' has no name'}")


def _check_range_ends(tables: _RawTables, have: tuple[str, dict], source: Path) -> None:
    if "end" not in have[1] or "eventtype" not in have[1]:
        if "end" not in have[1] and tables.count(have[0], f"eventType IN {RANGE_TYPES}"):
            raise UserError(f"{source}: table {have[0]} has no column end, and it holds ranges")
        return
    ranges = tables.count(have[0], f"eventType IN {RANGE_TYPES}")
    if ranges and not tables.count(have[0], f'eventType IN {RANGE_TYPES} AND "end" IS NOT NULL'):
        raise UserError(f"{source}: column {have[0]}.end is NULL in all {ranges:,} ranges")


def _check_unique_ids(tables: _RawTables, name: str, source: Path) -> None:
    found = tables.con.execute(f"""
        SELECT id, count(*), count(*) OVER () FROM {tables.relations[name]} WHERE id IS NOT NULL
        GROUP BY id HAVING count(*) > 1 ORDER BY min(_row) LIMIT 1""").fetchall()
    if found:
        id_, rows, ids = found[0]
        appear = "id appears" if ids == 1 else "ids appear"
        raise UserError(f"{source}: {name} holds id {id_} in {rows:,} rows ({ids:,} {appear} more than once); "
                        "each id must name one row")


def _check_times(tables: _RawTables, name: str, intervals: str, source: Path) -> None:
    """Every start and end within ±TIME_LIMIT_NS, and no interval (a row satisfying `intervals`) that ends
    before it starts."""
    backwards = f'"end" < start AND {intervals}'
    low_start, high_start, low_end, high_end, count, first = tables.con.execute(f"""
        SELECT min(start), max(start), min("end"), max("end"), count(*) FILTER (WHERE {backwards}),
               arg_min([start, "end"], _row) FILTER (WHERE {backwards})
        FROM {tables.relations[name]}""").fetchone()
    for column, values in (("start", (low_start, high_start)), ("end", (low_end, high_end))):
        for value in values:
            if value is not None and not -TIME_LIMIT_NS < value < TIME_LIMIT_NS:
                raise UserError(f"{source}: {name}.{column} {value} ns is past {TIME_RANGE} (any two must differ by "
                                "a 64-bit integer)")
    if count:
        unit = "range" if name.lower() == "nvtx_events" else "row"
        ends = f"{unit} of {name} ends before it starts" if count == 1 else f"{unit}s of {name} end before they start"
        raise UserError(f"{source}: {count:,} {ends} (the first: start {first[0]}, end {first[1]})")


def _of_kind(duckdb_type: str, kind: str) -> bool:
    if duckdb_type in _INTEGER_TYPES:
        return kind in (INT, NUMBER)
    if duckdb_type == "VARCHAR":
        return kind == TEXT
    if duckdb_type in ("DOUBLE", "FLOAT") or duckdb_type.startswith("DECIMAL"):
        return kind == NUMBER
    return False
