"""nsys's own tables in the schema `nsys`, each value stored once; every table reads as `nsys.<table>`.

DuckDB gives every table at least one block of its file, and writing a value costs more than reading
it back, so nsys's tables are kept three ways:

- **Held by a normalized table** (`HELD`: NVTX_EVENTS, CUPTI_ACTIVITY_KIND_RUNTIME, _KERNEL, _MEMCPY,
  _MEMSET): the hidden table `nsys._<table>` keeps, per raw row, its position in the export and the
  columns the normalized row it became does not hold; the view `nsys.<table>` joins them back by that
  position (the normalized table's `export_row`) into nsys's rows and columns. Rows no normalized table
  holds (domain names, backtrace rows, ...) are kept whole there.
- **Small** (at most `SMALL_ROWS` rows, every column BIGINT, VARCHAR, DOUBLE or BOOLEAN: the ENUM
  tables, metadata, strings, thread names, OS runtime calls of a short capture): the rows of all of them
  share one table, `nsys._small_tables`, each column in a slot of its type (`i0`, `t0`, `d0`, `b0`, ...),
  and each is a view over its rows.
- Any other table is a table as exported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from itertrace.ingest.adapters import RAW_VIEWS
from itertrace.ingest.arrow_io import TableStream
from itertrace.ingest.checks import RANGE_TYPES
from itertrace.ingest.loader import LoadContext, quote

if TYPE_CHECKING:  # scan imports pyarrow, which a Kineto ingest (importing SCHEMA) never does
    from itertrace.ingest.scan import Column, Sources

SCHEMA = "nsys"
SMALL_TABLE = "_small_tables"
SMALL_ROWS = 100_000
EXPORT_ROW = "_export_row"  # the hidden table's column of each raw row's position in the export
LONG_TEXT = 16 << 10
_SLOT_PREFIX = {"BIGINT": "i", "VARCHAR": "t", "DOUBLE": "d", "BOOLEAN": "b"}
_UBIGINT_TO_BIGINT = "CASE WHEN {c} >= 9223372036854775808 THEN ({c}::HUGEINT - 18446744073709551616)::BIGINT ELSE {c}::BIGINT END"
_NOTE = ("nsys export table {name} as nsys wrote it, with text decoded to VARCHAR and every integer stored as "
         "BIGINT (uint64 bit for bit, as in nsys's SQLite export)")
# Rows an export made during this ingest writes about itself (its time, its temporary output path):
# left out so that ingesting the same report again gives the same database.
_VOLATILE_EXPORT_ROWS = "{c} LIKE 'EXPORT_TIME%' OR {c} LIKE '%OUTPUT%' OR {c} LIKE '%OUTUPT%'"
_EXPORT_META_TABLES = ("EXPORT_META_DATA", "META_DATA_EXPORT")


@dataclass(frozen=True)
class Link:
    """How raw rows of one kind became rows of a normalized table, and which raw columns it holds."""

    held: str  # SQL over the raw row's columns ({name} in lower case): true for the rows the table holds
    table: str  # the normalized table, whose `export_row` is the position of the raw row each row came from
    columns: dict[str, str]  # raw column, lower case -> its raw value as SQL over {n}, that normalized row
    rows: str | None = None  # which rows of the normalized table came from this raw table, where not all did


@dataclass(frozen=True)
class Held:
    """A raw table whose rows normalized tables hold, through one link per kind of row."""

    raw: str
    adapter: str  # the adapter view (adapters.RAW_VIEWS) the normalized SQL reads it through
    links: tuple[Link, ...]


_PAYLOADS = {"int64value": "{n}.int64_value", "uint64value": _UBIGINT_TO_BIGINT.format(c="{n}.uint64_value"),
             "doublevalue": "{n}.double_value", "uint32value": "{n}.uint32_value", "int32value": "{n}.int32_value"}
# nvtx_ranges.text and nvtx_marks.text are the inline text, else the registered string: where some raw
# rows have inline text and some not, the hidden table's `_text_null` says which had none.
_NVTX = {"category": "{n}.category_id", "color": "{n}.color", "globaltid": "{n}.global_tid", "text": "{n}.text",
         **_PAYLOADS}
_GPU = {"start": "{n}.start_ns", "end": "{n}.end_ns", "deviceid": "{n}.device_id", "contextid": "{n}.context_id",
        "streamid": "{n}.stream_id", "correlationid": "{n}.correlation_id", "globalpid": "{n}.global_pid"}
_GPU_BYTES = {**_GPU, "bytes": "{n}.bytes"}


def _gpu_link(kind: str, columns: dict[str, str]) -> Link:
    return Link("true", "_gpu_op_rows", columns, f"kind = '{kind}'")


HELD = (
    Held("NVTX_EVENTS", "_raw_nvtx", (
        Link(f"{{eventtype}} IN {RANGE_TYPES}", "_nvtx_range_rows",  # as nesting.py
             {"start": "{n}.start_ns", "end": "{n}.end_ns", "endglobaltid": "{n}.end_global_tid", **_NVTX}),
        Link("{eventtype} = 34", "_nvtx_mark_rows",  # as nvtx_marks.sql
             {"start": "{n}.ts_ns", **_NVTX}),
    )),
    Held("CUPTI_ACTIVITY_KIND_RUNTIME", "_raw_runtime", (
        Link("{eventclass} IS DISTINCT FROM 67", "_cuda_api_rows",  # as cuda_api.sql
             {"start": "{n}.start_ns", "end": "{n}.end_ns", "eventclass": "{n}.event_class",
              "globaltid": "{n}.global_tid", "correlationid": "{n}.correlation_id",
              "returnvalue": "{n}.return_value"}),
    )),
    Held("CUPTI_ACTIVITY_KIND_KERNEL", "_raw_kernels", (_gpu_link("kernel", _GPU),)),
    Held("CUPTI_ACTIVITY_KIND_MEMCPY", "_raw_memcpy", (_gpu_link("memcpy", _GPU_BYTES),)),
    Held("CUPTI_ACTIVITY_KIND_MEMSET", "_raw_memset", (_gpu_link("memset", _GPU_BYTES),)),
)


def store_raw_tables(ctx: LoadContext, sources: Sources, tables: list[TableStream], drop_volatile: bool) -> None:
    """Write every table of the export into the schema `nsys`, after the normalized tables are built."""
    con = ctx.con
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    held = {spec.raw.lower(): spec for spec in HELD}
    small = [t for t in tables if t.name.lower() not in held and _is_small(t, sources.columns[t.name])]
    for table in tables:
        if table.name.lower() in held:
            _store_held(ctx, sources, table.name, held[table.name.lower()])
        elif table not in small:
            ctx.progress.phase(f"writing {table.name}")
            columns = ", ".join(quote(c.name) for c in sources.columns[table.name])
            con.execute(f"CREATE TABLE {SCHEMA}.{quote(table.name)} AS SELECT {columns} FROM {sources.relations[table.name]}")
            _comment(ctx, "TABLE", table.name, _NOTE.format(name=table.name) + ".")
            _count(ctx, table.num_rows)
    if small:
        _store_small(ctx, sources, small, drop_volatile)
    if drop_volatile:
        for table in tables:
            if table.name in _EXPORT_META_TABLES and table not in small and table.name.lower() not in held:
                condition = _VOLATILE_EXPORT_ROWS.format(c="name")
                con.execute(f"DELETE FROM {SCHEMA}.{quote(table.name)} WHERE {condition}")


def _is_small(table: TableStream, columns: tuple[Column, ...]) -> bool:
    return table.num_rows <= SMALL_ROWS and all(c.kind in _SLOT_PREFIX for c in columns)


def _long_text(ctx: LoadContext, rows: str, slots: list[str]) -> set[str]:
    """The text slots holding a value of more than `LONG_TEXT` bytes.

    DuckDB keeps such a value uncompressed, in blocks of its own (GpuMetricsConfig's YAML in
    TARGET_INFO_SYSTEM_ENV runs past 100 KB): those slots are stored in ZSTD, which DuckDB writes in
    blocks of their own too, so it pays only where a value is long."""
    if not slots:
        return set()
    longest = ctx.con.execute(f"SELECT {', '.join(f'max(strlen({slot}))' for slot in slots)} FROM ({rows})").fetchone()
    return {slot for slot, n in zip(slots, longest) if (n or 0) > LONG_TEXT}


def _count(ctx: LoadContext, rows: int) -> None:
    ctx.rows_written += rows
    ctx.progress.advance(rows, "nsys tables")


def _comment(ctx: LoadContext, kind: str, name: str, text: str) -> None:
    literal = text.replace("'", "''")
    ctx.con.execute(f"COMMENT ON {kind} {SCHEMA}.{quote(name)} IS '{literal}'")


def _store_held(ctx: LoadContext, sources: Sources, name: str, spec: Held) -> None:
    """The hidden table of what the normalized tables do not hold, and the view that joins it back."""
    from itertrace.ingest.scan import ROW

    ctx.progress.phase(f"writing {name}")
    plan = _plan_held(ctx, sources, name, spec)
    hidden = f"_{name}"
    select = [f"r.{ROW} AS {EXPORT_ROW}"]
    if plan.text_flag:
        select.append(f"r.{quote(plan.text_flag)} IS NULL AS _text_null")
    for column in sources.columns[name]:
        if column.name not in plan.kept:
            continue
        holders = [i for i, names in enumerate(plan.derived) if column.name in names]
        value = f"r.{quote(column.name)}"
        if holders:
            held = " OR ".join(plan.held[i] for i in holders)
            value = f"CASE WHEN NOT ({held}) THEN {value} END"
        select.append(f"{value} AS {quote(column.name)}")
    ctx.con.execute(f"CREATE TABLE {SCHEMA}.{quote(hidden)} AS SELECT {', '.join(select)} "
                    f"FROM {sources.relations[name]} AS r")
    view = []
    for column in sources.columns[name]:
        cases = [f"WHEN n{i}.export_row IS NOT NULL THEN CAST({_held_value(link, column.name, plan, i)} AS {column.kind})"
                 for i, link in enumerate(spec.links) if column.name in plan.derived[i]]
        rest = f"x.{quote(column.name)}" if column.name in plan.kept else f"CAST(NULL AS {column.kind or 'VARCHAR'})"
        view.append(f"CASE {' '.join(cases)} ELSE {rest} END AS {quote(column.name)}" if cases else f"{rest} AS {quote(column.name)}")
    joins = " ".join(f"LEFT JOIN {_held_rows(link)} AS n{i} ON n{i}.export_row = x.{EXPORT_ROW}"
                     for i, link in enumerate(spec.links))
    ctx.con.execute(f"CREATE VIEW {SCHEMA}.{quote(name)} AS SELECT {', '.join(view)} "
                    f"FROM {SCHEMA}.{quote(hidden)} AS x {joins}")
    held_by = " and ".join(sorted({link.table for link in spec.links}))
    _comment(ctx, "VIEW", name, _NOTE.format(name=name) + f"; a view: the columns {held_by} holds are read from there, "
             f"the others from {SCHEMA}.{hidden}.")
    _comment(ctx, "TABLE", hidden, f"The columns of {SCHEMA}.{name} that {held_by} does not hold, with each raw row's "
             f"position in the export ({EXPORT_ROW}: {held_by}'s export_row, where it holds the row) and no column "
             f"that would hold only NULLs; read it through the view {SCHEMA}.{name}.")
    _count(ctx, sources.rows[name])


@dataclass(frozen=True)
class _HeldPlan:
    """Which raw columns each link gives back, and which the hidden table keeps."""

    held: list[str]  # per link, SQL over the raw row `r`: true where the link's table holds the row
    derived: list[list[str]]  # per link, the raw columns read back from its normalized table
    kept: set[str]  # raw columns the hidden table stores (for rows no link gives them back)
    text_flag: str | None  # the text column, where the hidden table must say which rows had no inline text


def _plan_held(ctx: LoadContext, sources: Sources, name: str, spec: Held) -> _HeldPlan:
    columns = sources.columns[name]
    adapter = {column.lower(): kind for view in RAW_VIEWS if view.view == spec.adapter for column, kind in view.columns}
    # A raw column is read back from a normalized table only if the normalized SQL read it with its own type.
    derived = [[c.name for c in columns if c.name.lower() in link.columns and adapter.get(c.name.lower()) == c.kind]
               for link in spec.links]
    present_names = _RawNames({c.name.lower(): f"r.{quote(c.name)}" for c in columns})
    held_sql = [f"coalesce({link.held.format_map(present_names)}, false)" for link in spec.links]
    counts = ", ".join(["count(*)"] + [f"count({quote(c.name)})" for c in columns] + [f"count(*) FILTER ({h})" for h in held_sql])
    total, *present = ctx.con.execute(f"SELECT {counts} FROM {sources.relations[name]} AS r").fetchone()
    present, held_rows = present[:len(columns)], present[len(columns):]
    raw = dict(zip((c.name for c in columns), present))
    given = {c.name: 0 for c in columns}  # non-NULL values the links give back, per raw column
    for i, link in enumerate(spec.links):
        names = [c for c in derived[i] if c.lower() != "text"]
        sums = ", ".join(["count(n.export_row)"] + [f"count({link.columns[c.lower()].format(n='n')})" for c in names])
        where = f" WHERE {link.rows}" if link.rows else ""
        rows, *found = ctx.con.execute(f"SELECT {sums} FROM main.{link.table} AS n{where}").fetchone()
        if rows != held_rows[i]:  # the view would lose or double rows: a bug, never the export's fault
            raise RuntimeError(f"{name}: {held_rows[i]:,} raw rows satisfy {link.held}, but {link.table} holds "
                               f"{rows:,} of its rows")
        for column, n in zip(names, found):
            given[column] += n
    text = next((c for names in derived for c in names if c.lower() == "text"), None)
    text_flag = text if text is not None and 0 < raw[text] < total else None
    if text is not None and raw[text] == 0:  # no row had inline text: the registered strings are not raw text
        derived = [[c for c in names if c != text] for names in derived]
    held = {c for names in derived for c in names}
    # A column a link gives back is kept for the rows none does; text, whose rows the counts cannot tell, if any.
    kept = {c.name for c in columns if raw[c.name] > (0 if c.name not in held or c.name == text else given[c.name])}
    return _HeldPlan(held_sql, derived, kept, text_flag)


class _RawNames(dict):
    """Raw columns by lower-case name for `Link.held`; a column the export lacks reads as NULL."""

    def __missing__(self, key: str) -> str:
        return "NULL"


def _held_rows(link: Link) -> str:
    return f"main.{link.table}" if link.rows is None else f"(SELECT * FROM main.{link.table} WHERE {link.rows})"


def _held_value(link: Link, column: str, plan: _HeldPlan, i: int) -> str:
    if column == plan.text_flag:
        return f"CASE WHEN x._text_null THEN NULL ELSE n{i}.{column} END"
    return link.columns[column.lower()].format(n=f"n{i}", x="x")


def _store_small(ctx: LoadContext, sources: Sources, tables: list[TableStream], drop_volatile: bool) -> None:
    """The rows of every small table in one table, and a view per table.

    Tables go in by size, smallest first, then name: the same order from every layout of one export, and
    on the static sample capture one block smaller than by name alone."""
    from itertrace.ingest.scan import ROW

    tables = sorted(tables, key=lambda table: (table.num_rows, table.name))
    slots: dict[str, int] = {kind: 0 for kind in _SLOT_PREFIX}
    places: dict[str, list[str]] = {}
    for table in tables:
        used = {kind: 0 for kind in _SLOT_PREFIX}
        places[table.name] = []
        for column in sources.columns[table.name]:
            places[table.name].append(f"{_SLOT_PREFIX[column.kind]}{used[column.kind]}")
            used[column.kind] += 1
        slots = {kind: max(slots[kind], used[kind]) for kind in slots}
    names = [f"{_SLOT_PREFIX[kind]}{i}" for kind in _SLOT_PREFIX for i in range(slots[kind])]
    kinds = {f"{_SLOT_PREFIX[kind]}{i}": kind for kind in _SLOT_PREFIX for i in range(slots[kind])}
    parts = []
    for number, table in enumerate(tables):
        have = dict(zip(places[table.name], (c.name for c in sources.columns[table.name])))
        values = [f"{quote(have[slot])} AS {slot}" if slot in have else f"CAST(NULL AS {kinds[slot]}) AS {slot}"
                  for slot in names]
        columns = [c.name for c in sources.columns[table.name]]
        keep = ""
        if drop_volatile and table.name in _EXPORT_META_TABLES and "name" in columns:
            keep = f" WHERE NOT coalesce({_VOLATILE_EXPORT_ROWS.format(c=quote('name'))}, false)"
        parts.append(f"SELECT {number} AS table_id, {ROW} AS row_id{''.join(', ' + v for v in values)} "
                     f"FROM {sources.relations[table.name]}{keep}")
    union = f"SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY table_id, row_id"
    long = _long_text(ctx, union, [slot for slot in names if kinds[slot] == "VARCHAR"])
    declared = ", ".join(["table_id INTEGER", "row_id BIGINT"] + [
        f"{slot} {kinds[slot]}{' USING COMPRESSION zstd' if slot in long else ''}" for slot in names])
    ctx.con.execute(f"CREATE TABLE {SCHEMA}.{SMALL_TABLE} ({declared})")
    ctx.con.execute(f"INSERT INTO {SCHEMA}.{SMALL_TABLE} {union}")
    _count(ctx, sum(table.num_rows for table in tables))
    for number, table in enumerate(tables):
        select = ", ".join(f"{slot} AS {quote(name)}" for slot, name in
                           zip(places[table.name], (c.name for c in sources.columns[table.name])))
        ctx.con.execute(f"CREATE VIEW {SCHEMA}.{quote(table.name)} AS SELECT {select} FROM {SCHEMA}.{SMALL_TABLE} "
                        f"WHERE table_id = {number} ORDER BY row_id")
        _comment(ctx, "VIEW", table.name, _NOTE.format(name=table.name) + f"; a view over its rows in {SCHEMA}.{SMALL_TABLE}.")
    _comment(ctx, "TABLE", SMALL_TABLE, "The rows of nsys's small tables (each of at most "
             f"{SMALL_ROWS:,} rows), one row per raw row: the table's number, the row's position in it, and each "
             "column in a slot of its type (i: BIGINT, t: VARCHAR, d: DOUBLE, b: BOOLEAN); read them through the view named "
             "after each table.")
