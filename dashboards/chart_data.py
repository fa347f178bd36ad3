"""Tables into chart data: accept Arrow or pandas, stack runs under a label, and bin or thin large inputs.

Every chart function reduces its input here, in an in-memory DuckDB session over the Arrow table, so a
chart embeds at most a few thousand rows whatever the size of the run. Durations become milliseconds
(`*_ms`, floats) on the way, since people read ms and Vega-Lite numbers are doubles; instants count from
the capture's start (time_axis.py).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import duckdb
import pyarrow as pa

NS_PER_MS = 1_000_000

# A table as the chart functions take it: a pyarrow Table, a pandas DataFrame, or anything that
# speaks the Arrow C stream protocol (polars, a DuckDB relation).
TableLike = Any


def as_arrow(table: TableLike, columns: Sequence[str] = (), *, what: str = "table") -> pa.Table:
    """`table` as a pyarrow Table, checked to hold `columns`; ValueError naming the missing ones."""
    if isinstance(table, pa.Table):
        result = table
    elif hasattr(table, "to_arrow_table"):  # a DuckDB relation
        result = table.to_arrow_table()
    elif type(table).__module__.startswith("pandas"):
        result = pa.Table.from_pandas(table, preserve_index=False)
    else:
        result = pa.table(table)
    missing = [c for c in columns if c not in result.column_names]
    if missing:
        raise ValueError(f"{what} lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                         f"(it has {', '.join(result.column_names) or 'none'})")
    return result


def label_runs(tables: Mapping[str, TableLike] | Sequence[tuple[str, TableLike]], column: str = "run") -> pa.Table:
    """One table of several runs' rows, each tagged with its label in a first column `column` (labels may repeat)."""
    parts = []
    for label, table in (tables.items() if isinstance(tables, Mapping) else tables):
        arrow = as_arrow(table)
        if column in arrow.column_names:
            arrow = arrow.drop_columns([column])
        parts.append(arrow.add_column(0, column, pa.array([label] * arrow.num_rows, pa.string())))
    if not parts:
        raise ValueError("label_runs needs at least one table")
    return pa.concat_tables(parts, promote_options="permissive")


def sql(query: str, **tables: pa.Table) -> pa.Table:
    """Run `query` in a fresh in-memory DuckDB session in which each keyword names an Arrow table.

    Decimal results (DuckDB's sums of integers) come back as doubles, which JSON and Vega-Lite take.
    """
    con = duckdb.connect()
    try:
        for name, table in tables.items():
            con.register(name, table)
        result = con.sql(query).to_arrow_table()
    finally:
        con.close()
    for i, field in enumerate(result.schema):
        if pa.types.is_decimal(field.type):
            result = result.set_column(i, field.name, result.column(i).cast(pa.float64()))
    return result


def sql_text(value: str) -> str:
    """`value` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def bin_width(span: int, max_bins: int) -> int:
    """Iterations per bin so that `span` iterations fill at most `max_bins` bins (1: no binning)."""
    return max(1, math.ceil(span / max(1, max_bins)))


def labels_in_order(table: pa.Table, column: str) -> list[str]:
    """The distinct values of `column` in order of first appearance (the order runs were given in)."""
    seen: dict[str, None] = {}
    for value in table.column(column).to_pylist():
        seen.setdefault(str(value), None)
    return list(seen)


def iteration_span(table: pa.Table, column: str = "iteration") -> int:
    """Iterations from the smallest to the largest number in `column`, inclusive; 0 when empty."""
    if table.num_rows == 0:
        return 0
    row = sql(f"SELECT max({column}) - min({column}) + 1 AS n FROM t", t=table.select([column])).to_pylist()[0]
    return int(row["n"] or 0)


def iteration_axis(width_px: int) -> alt.Axis:
    """An axis of iteration numbers: integers, about one label per 80 pixels, none overlapping."""
    return alt.Axis(format="d", tickCount=max(2, width_px // 80), labelOverlap="greedy", labelFlush=True)
