"""Each raw table of an export as a DuckDB relation with uniform column types, read where it lies.

A Parquet table is read by DuckDB's own Parquet reader, in parallel; an Arrow IPC table is memory-mapped
and handed to DuckDB without a copy. Either way the relation has the column types `convert.uniform_type`
gives (text VARCHAR, integers BIGINT with uint64 bit for bit, floats DOUBLE) and a column `_row`, the
row's position in its table. Text that is not UTF-8 keeps its row with the bad bytes replaced: such a
Parquet table is read through pyarrow instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from itertrace.ingest.arrow_io import TableStream
from itertrace.ingest.convert import arrow_for_duckdb, uniform_type
from itertrace.ingest.loader import quote

ROW = "_row"
SCAN_BATCH_ROWS = 122_880  # DuckDB's row group size
_BIGINT_FROM_UBIGINT = "CASE WHEN {c} >= 9223372036854775808 THEN ({c}::HUGEINT - 18446744073709551616)::BIGINT ELSE {c}::BIGINT END"


@dataclass(frozen=True)
class Column:
    """A column of a source relation: its name and its DuckDB type there."""

    name: str
    kind: str  # BIGINT, DOUBLE, VARCHAR, or the type DuckDB gives a column of another Arrow type


@dataclass
class Sources:
    """The relations of one export's tables, open on a connection until `close`."""

    con: duckdb.DuckDBPyConnection
    relations: dict[str, str] = field(default_factory=dict)  # table name -> SQL relation, usable after FROM
    columns: dict[str, tuple[Column, ...]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    _registered: dict[str, pa.Table] = field(default_factory=dict)

    def reader(self) -> duckdb.DuckDBPyConnection:
        """A second connection to `con`'s database on which the relations read the same."""
        side = self.con.cursor()
        for name, arrow in self._registered.items():
            side.register(name, arrow)
        return side

    def close(self) -> None:
        """Let go of the Arrow tables handed to DuckDB."""
        for name in self._registered:
            try:
                self.con.unregister(name)
            except duckdb.Error:  # an aborted transaction took the view with it
                pass
        self._registered.clear()


def open_sources(con: duckdb.DuckDBPyConnection, tables: list[TableStream]) -> Sources:
    """Relations over `tables`, registered on `con`."""
    sources = Sources(con)
    with duckdb.connect() as side:  # reads Parquet text to see that it is UTF-8, outside the ingest's transaction
        for i, table in enumerate(tables):
            if table.file.suffix == ".parquet" and _parquet_text_is_utf8(side, table):
                base, kinds = _parquet_base(table)
            else:
                base, kinds = _arrow_base(con, table, f"_ingest_source_{i}", sources)
            columns = tuple(Column(f.name, uniform_sql_type(f.type)) for f in table.schema)
            select = ", ".join(_cast(c.name, kinds[c.name], c.kind) for c in columns)
            sources.relations[table.name] = f"(SELECT {select}{', ' if select else ''}{ROW} FROM {base})"
            sources.columns[table.name] = columns
            sources.rows[table.name] = table.num_rows
    return sources


def uniform_sql_type(kind: pa.DataType) -> str:
    """The DuckDB type of a column of Arrow type `kind` once made uniform."""
    target = uniform_type(kind)
    if pa.types.is_integer(target):
        return "BIGINT"
    if pa.types.is_floating(target):
        return "DOUBLE"
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return "VARCHAR"
    if pa.types.is_boolean(target):
        return "BOOLEAN"
    return ""  # another type: whatever DuckDB makes of it, unchanged


def _cast(name: str, have: str, want: str) -> str:
    column = quote(name)
    if not want or have == want:
        return column
    if have == "UBIGINT":
        return f"{_BIGINT_FROM_UBIGINT.format(c=column)} AS {column}"
    return f"CAST({column} AS {want}) AS {column}"


def _parquet_base(table: TableStream) -> tuple[str, dict[str, str]]:
    path = str(table.file).replace("'", "''")
    base = f"read_parquet('{path}', binary_as_string = true, file_row_number = true)"
    kinds = {f.name: _duckdb_type(f.type) for f in table.schema}
    return f"(SELECT * EXCLUDE (file_row_number), file_row_number AS {ROW} FROM {base})", kinds


def _duckdb_type(kind: pa.DataType) -> str:
    if pa.types.is_dictionary(kind):
        return _duckdb_type(kind.value_type)
    names = {pa.uint64(): "UBIGINT", pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}
    if kind in names:
        return names[kind]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "VARCHAR"
    return "other"


def _parquet_text_is_utf8(side: duckdb.DuckDBPyConnection, table: TableStream) -> bool:
    """Whether DuckDB's Parquet reader accepts every text column (it refuses bytes that are not UTF-8)."""
    text = [f.name for f in table.schema if _duckdb_type(f.type) == "VARCHAR"]
    if not text:
        return True
    path = str(table.file).replace("'", "''")
    counts = ", ".join(f"count({quote(name)})" for name in text)
    try:
        side.execute(f"SELECT {counts} FROM read_parquet('{path}', binary_as_string = true)").fetchall()
    except duckdb.InvalidInputException:
        return False
    return True


def row_numbers(rows: int) -> pa.Array:
    """0, 1, ..., rows - 1 as an int64 array."""
    return from_numpy(np.arange(rows, dtype=np.int64))


def from_numpy(values: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    """A numpy array of fixed-width numbers (or bools) as Arrow, NULL where `null` is True, from its buffer:
    pa.array on an ndarray imports pandas, a third of a second."""
    if values.dtype == np.bool_:
        data = pa.py_buffer(np.packbits(values, bitorder="little"))
        kind = pa.bool_()
    else:
        values = np.ascontiguousarray(values)
        data, kind = pa.py_buffer(values), pa.from_numpy_dtype(values.dtype)
    validity = None if null is None or not null.any() else pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(kind, len(values), [validity, data])


def _arrow_base(con: duckdb.DuckDBPyConnection, table: TableStream, name: str,
                sources: Sources) -> tuple[str, dict[str, str]]:
    whole = table.whole() if table.whole is not None else pq.read_table(table.file)
    arrow = arrow_for_duckdb(whole)
    arrow = arrow.append_column(ROW, row_numbers(arrow.num_rows))
    # In batches (slices, no copy): DuckDB scans an Arrow table one batch per thread, and nsys writes
    # each table as one batch.
    arrow = pa.Table.from_batches(arrow.to_batches(max_chunksize=SCAN_BATCH_ROWS), arrow.schema)
    con.register(name, arrow)
    sources._registered[name] = arrow
    kinds = {f.name: _duckdb_type(f.type) if f.type in (pa.int64(), pa.float64(), pa.string()) else "other"
             for f in arrow.schema}
    return name, kinds
