"""Arrow column types made uniform before they reach DuckDB: text as VARCHAR, every integer as BIGINT.

Notes
-----
nsys 2022.4's Arrow export carries strings as `binary` and mixes int32, uint32 and uint64 id columns;
its SQLite export (and the parquetdir folders converted from it) store every integer as a signed 64-bit
value. Converting every source to the SQLite shape makes ids joinable across tables and versions:
narrower integers widen losslessly, and uint64 is reinterpreted as int64 bit for bit, as nsys's own
SQLite export does (only NVTX `uint64Value` payloads can reach 2**63; the normalized `nvtx_ranges`
table turns them back into UBIGINT).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def uniform_type(kind: pa.DataType) -> pa.DataType:
    """The type a column of `kind` is stored as in the database."""
    if pa.types.is_dictionary(kind):
        return uniform_type(kind.value_type)
    if pa.types.is_binary(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.large_string()
    if pa.types.is_integer(kind):
        return pa.int64()
    if pa.types.is_floating(kind):
        return pa.float64()
    return kind


def uniform_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` with every field converted by `uniform_type` and the nsys metadata dropped."""
    return pa.schema([pa.field(f.name, uniform_type(f.type), f.nullable) for f in schema])


def uniform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` converted to `schema` (made by `uniform_schema` from the batch's own schema)."""
    columns = [_convert(column, field.type) for column, field in zip(batch.columns, schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def arrow_for_duckdb(table: pa.Table) -> pa.Table:
    """`table` with text decoded and uint64 reinterpreted, without copying what needs no change.

    Narrower integers and floats stay as they are: DuckDB widens them as it reads (see `scan`).
    """
    fields, columns = [], []
    for f, column in zip(table.schema, table.columns):
        target = uniform_type(f.type)
        keep = not pa.types.is_dictionary(f.type) and (
            pa.types.is_integer(f.type) and f.type != pa.uint64() or pa.types.is_floating(f.type) or f.type == target)
        if not keep:
            column = pa.chunked_array([_convert(chunk, target) for chunk in column.chunks], target)
        fields.append(pa.field(f.name, column.type, f.nullable))
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _convert(column: pa.Array, target: pa.DataType) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.type == target:
        return column
    if column.type == pa.uint64():
        return column.view(pa.int64())  # two's complement, like nsys's SQLite export
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return _decode_text(column, target)
    return pc.cast(column, target)


def _decode_text(column: pa.Array, target: pa.DataType) -> pa.Array:
    try:
        return pc.cast(column, target)
    except pa.ArrowInvalid:  # not UTF-8: keep the row, replace the bad bytes
        values = [None if v is None else v.decode("utf-8", "replace") for v in column.to_pylist()]
        return pa.array(values, type=target)
