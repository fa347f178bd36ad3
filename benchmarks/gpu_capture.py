"""A GPU-shaped capture of any size, made by repeating a real export with shifted timestamps and ids.

Copy k (k = 0, 1, ...) of every table with a `start` column (NVTX ranges, CUDA runtime calls, kernels,
memcpys, memsets, synchronizations, ...) is the original with `start` and `end` moved later by k times
the capture's span (its last `end` minus its first `start`, plus 1 us), and `correlationId`, `gridId`
and `rangeId` moved up by k times one more than their largest value, so that each copy's API calls
join only their own GPU work. Every other table (strings, threads, processes, enums, metadata) is
written once. The layout is that of the source, a parquetdir (`TABLE.parquet`), or an Arrow export
(one file of concatenated IPC streams, the table name in each stream's `table_name` metadata).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

SHIFTED_IDS = ("correlationId", "gridId", "rangeId")
ROW_GROUP_ROWS = 122_880  # DuckDB's row group size: the reader parallelizes over row groups


def source_tables(folder: Path) -> dict[str, pa.Table]:
    """Every table of a parquetdir export."""
    return {file.stem: pq.read_table(file) for file in sorted(folder.glob("*.parquet"))}


def repeated_rows(tables: dict[str, pa.Table], copies: int) -> int:
    """Rows of the capture `write_capture` makes from `tables` with `copies` copies."""
    return sum(t.num_rows * (copies if "start" in t.column_names else 1) for t in tables.values())


def copies_for(tables: dict[str, pa.Table], rows: int) -> int:
    """The fewest copies that give at least `rows` rows."""
    copies = 1
    while repeated_rows(tables, copies) < rows:
        copies += 1
    return copies


def _span_ns(tables: dict[str, pa.Table]) -> int:
    starts = [pc.min(t["start"]).as_py() for t in tables.values() if "start" in t.column_names and t.num_rows]
    ends = [pc.max(t["end"]).as_py() for t in tables.values() if "end" in t.column_names and t.num_rows]
    return max(e for e in ends if e is not None) - min(starts) + 1_000


def _id_strides(tables: dict[str, pa.Table]) -> dict[str, int]:
    strides = {}
    for name in SHIFTED_IDS:
        highs = [pc.max(t[name]).as_py() for t in tables.values() if name in t.column_names and t.num_rows]
        strides[name] = max((h for h in highs if h is not None), default=0) + 1
    return strides


def _copy(table: pa.Table, k: int, span_ns: int, strides: dict[str, int]) -> pa.Table:
    if k == 0:
        return table
    columns = []
    for name, column in zip(table.column_names, table.columns):
        shift = k * span_ns if name in ("start", "end") else k * strides[name] if name in strides else 0
        columns.append(pc.add(column, pa.scalar(shift, column.type)) if shift else column)
    return pa.table(columns, schema=table.schema)


def write_capture(tables: dict[str, pa.Table], copies: int, out: Path, layout: str = "parquetdir") -> int:
    """Write `copies` copies of the event tables (and one of the others) to `out`; the rows written."""
    span_ns, strides = _span_ns(tables), _id_strides(tables)
    rows = 0
    if layout == "parquetdir":
        out.mkdir(parents=True)
    sink = open(out, "wb") if layout == "arrow" else None
    try:
        for name, table in tables.items():
            repeats = copies if "start" in table.column_names else 1
            per_write = max(1, ROW_GROUP_ROWS // max(1, table.num_rows))  # copies per row group
            if layout == "parquetdir":
                writer = pq.ParquetWriter(out / f"{name}.parquet", table.schema)
            else:
                writer = ipc.new_stream(sink, table.schema.with_metadata({"table_name": name}))
            with writer:
                for first in range(0, repeats, per_write):
                    ks = range(first, min(repeats, first + per_write))
                    part = pa.concat_tables([_copy(table, k, span_ns, strides) for k in ks])
                    if layout == "parquetdir":
                        writer.write_table(part, row_group_size=ROW_GROUP_ROWS)
                    else:
                        writer.write_table(part, max_chunksize=ROW_GROUP_ROWS)
            rows += table.num_rows * repeats
    finally:
        if sink is not None:
            sink.close()
    return rows
