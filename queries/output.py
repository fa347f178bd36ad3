"""Writing a query's rows: an aligned text table, CSV, JSON or Parquet, to a file or to standard output.

CSV, JSON and Parquet are written by DuckDB's COPY, streaming from the query, into a temporary file
beside the target that is renamed onto it only when complete. Standard output gets the table, CSV
or JSON formats.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TextIO

import duckdb

from itertrace.errors import UserError, no_folder_for

FORMATS = ("table", "csv", "json", "parquet")
_COPY = {"csv": "(FORMAT csv, HEADER true)", "json": "(FORMAT json, ARRAY true)", "parquet": "(FORMAT parquet)"}


def write(con: duckdb.DuckDBPyConnection, sql: str, fmt: str, out: Path | None, *, max_rows: int | None,
          stdout: TextIO | None = None) -> int:
    """Run `sql` and write its rows in `fmt` to `out` (or stdout); returns the number of rows."""
    stdout = stdout or sys.stdout
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if fmt == "parquet" and out is None:
        raise UserError("--format parquet needs --out FILE")
    if out is not None and out.is_dir():
        raise UserError(f"{out}: is a folder; --out names a file")
    if out is not None and (why := no_folder_for(out)):
        raise UserError(f"--out {out}: {why}")
    if fmt == "table":
        rel = con.sql(sql)
        if rel is None:  # an empty statement, a comment, or one that returns no result
            raise UserError(f"SQL {sql!r}: no rows to show (give a statement that returns rows, e.g. a SELECT)")
        rows = rel.fetchall()
        text = format_table(rel.columns, rows, None if out is not None else max_rows)
        if out is None:
            stdout.write(text)
        else:
            _replace(out, lambda tmp: tmp.write_text(text))
        return len(rows)
    count = con.sql(f"SELECT count(*) FROM ({sql})").fetchall()[0][0]
    if out is None:
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder) / f"rows.{fmt}"
            _copy(con, sql, fmt, tmp)
            with tmp.open() as f:
                shutil.copyfileobj(f, stdout)
            if fmt == "json":
                stdout.write("\n")
    else:
        _replace(out, lambda tmp: _copy(con, sql, fmt, tmp))
    return count


def format_table(columns: list[str], rows: list[tuple], max_rows: int | None) -> str:
    """Rows as aligned text; above max_rows, the first rows and a line saying how many were left out."""
    shown = rows if max_rows is None or len(rows) <= max_rows else rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in shown) and bool(shown)
               for i in range(len(columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    if len(shown) < len(rows):
        out.append(f"... {len(rows) - len(shown):,} more rows ({len(rows):,} in all; --max-rows, --format or --out "
                   "shows them)")
    elif not rows:
        out.append("(no rows)")
    return "\n".join(out) + "\n"


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        inner = ", ".join(_cell(v) for v in value[:8])
        return f"[{inner}{', ...' if len(value) > 8 else ''}]"
    return str(value)


def _copy(con: duckdb.DuckDBPyConnection, sql: str, fmt: str, path: Path) -> None:
    quoted = "'" + str(path).replace("'", "''") + "'"
    con.execute(f"COPY ({sql}) TO {quoted} {_COPY[fmt]}")


def _replace(target: Path, make) -> None:
    """Write through `make(tmp)` into a temporary file beside target, then rename it onto target."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        tmp.unlink()
        make(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
