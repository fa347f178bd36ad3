"""Writing a query's rows: an aligned text table, CSV, JSON or Parquet, to a file or to standard output.

Rows stream from DuckDB in batches: a table on a terminal keeps only the rows it shows and counts (up to
COUNT_AT_MOST) the rest; a file is written batch by batch (a text table in two passes over a spilled copy of its cells,
to align its columns), by DuckDB's COPY for CSV, JSON and Parquet. A file goes to a hidden temporary
name beside the target and is renamed onto it only when complete; the target may be absent or a file
of query output (itertrace.targets).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import duckdb

from itertrace.errors import UserError
from itertrace.targets import Kind, hidden_file, remove_leftovers, replaceable, write_failure

FORMATS = ("table", "csv", "json", "parquet")
_COPY = {"csv": "(FORMAT csv, HEADER true)", "json": "(FORMAT json, ARRAY true)", "parquet": "(FORMAT parquet)"}
_BATCH_ROWS = 8192
COUNT_AT_MOST = 100_000  # rows counted past those a terminal's table shows


@dataclass(frozen=True)
class Output:
    """Where a statement's rows go: `target` (None: standard output) in `fmt`; `file` is what DuckDB itself
    writes (by COPY), the only path a confined connection may write (see itertrace.queries.api.connect)."""

    fmt: str
    target: Path | None
    file: Path | None

    @property
    def writable(self) -> tuple[Path, ...]:
        return (self.file,) if self.file is not None and self.fmt != "table" else ()


@contextlib.contextmanager
def output(fmt: str, out: Path | None) -> Iterator[Output]:
    """The output for `fmt` and `out`, checked and prepared before any database is opened: `out` may be
    absent or a file of query output (itertrace.targets); the hidden file beside it, or a temporary
    folder for CSV or JSON on standard output, is removed when the block ends."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if fmt == "parquet" and out is None:
        raise UserError("--format parquet needs --out FILE")
    if out is None:
        if fmt == "table":
            yield Output(fmt, None, None)
            return
        with tempfile.TemporaryDirectory() as folder:
            yield Output(fmt, None, Path(folder) / f"rows.{fmt}")
        return
    out = replaceable(out, Kind.ROWS, "--out")
    remove_leftovers(out)
    tmp = hidden_file(out, "tmp")
    try:
        yield Output(fmt, out, tmp)
    finally:
        tmp.unlink(missing_ok=True)


def write(con: duckdb.DuckDBPyConnection, sql: str, output: Output, *, max_rows: int | None,
          stdout: TextIO | None = None) -> int:
    """Run `sql` and write its rows as `output` says; returns the number of rows."""
    stdout = stdout or sys.stdout
    fmt, out, tmp = output.fmt, output.target, output.file
    if out is None:
        if fmt == "table":
            return _table(con, sql, stdout, max_rows)
        count = _copy(con, sql, fmt, tmp)
        with tmp.open() as f:
            shutil.copyfileobj(f, stdout)
        if fmt == "json":
            stdout.write("\n")
        return count
    try:
        if fmt == "table":
            with tmp.open("w") as f:
                count = _table(con, sql, f, None, spill=out)
        else:
            tmp.unlink()  # DuckDB makes the file itself
            count = _copy(con, sql, fmt, tmp)
        os.replace(tmp, out)
    except BaseException as exc:
        if why := write_failure(exc):
            raise UserError(f"--out {out}: cannot write it ({why}); nothing was written") from None
        raise
    return count


def format_table(columns: list[str], rows: list[tuple], max_rows: int | None, total: int | None = -1) -> str:
    """Rows as aligned text; above max_rows, the first rows and a line saying how many were left out.

    `total` is the number of rows in all when `rows` holds only the first of them, None when more were
    left than were counted (COUNT_AT_MOST)."""
    total = len(rows) if total == -1 else total
    shown = rows if max_rows is None or len(rows) <= max_rows else rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in shown) and bool(shown)
               for i in range(len(columns))]
    out = [_line(list(columns), widths, numeric), _line(["-" * w for w in widths], widths, numeric)]
    out.extend(_line(r, widths, numeric) for r in cells)
    if total is None:
        out.append(f"... over {COUNT_AT_MOST:,} more rows (--max-rows, --format or --out shows them)")
    elif len(shown) < total:
        out.append(f"... {total - len(shown):,} more rows ({total:,} in all; --max-rows, --format or --out "
                   "shows them)")
    elif not total:
        out.append("(no rows)")
    return "\n".join(out) + "\n"


def _line(values: list[str], widths: list[int], numeric: list[bool]) -> str:
    return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()


def _result(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyConnection:
    """The statement's result, streaming: rows are fetched as they are read (and Ctrl-C reaches DuckDB)."""
    res = con.execute(sql)
    if res is None or res.description is None:  # a comment, or a statement that returns no result
        raise UserError(f"SQL {sql!r}: no rows to show (give a statement that returns rows, e.g. a SELECT)")
    return res


def _table(con: duckdb.DuckDBPyConnection, sql: str, sink: TextIO, max_rows: int | None, *,
           spill: Path | None = None) -> int:
    """Write the statement's rows as a text table; returns how many there are.

    With `max_rows`, only the rows shown are kept, and the rest counted up to COUNT_AT_MOST (a query of
    billions of rows shows its first forty at once). Without, every row goes through a hidden file of
    cells beside `spill` (or in the temporary folder): a first pass finds each column's width, a second
    writes the lines."""
    res = _result(con, sql)
    columns = [d[0] for d in res.description]
    if max_rows is not None:
        shown = res.fetchmany(max_rows + 1)
        total = len(shown)
        while len(shown) > max_rows and total <= max_rows + COUNT_AT_MOST and (more := res.fetchmany(_BATCH_ROWS)):
            total += len(more)
        sink.write(format_table(columns, shown, max_rows, total if total <= max_rows + COUNT_AT_MOST else None))
        return total
    cells = hidden_file(spill, "tmp") if spill else Path(tempfile.mkstemp(suffix=".cells")[1])
    try:
        widths, numeric, total = [len(c) for c in columns], [True] * len(columns), 0
        with cells.open("w") as f:
            while rows := res.fetchmany(_BATCH_ROWS):
                for row in rows:
                    texts = [_cell(v) for v in row]
                    widths = [max(w, len(t)) for w, t in zip(widths, texts)]
                    numeric = [n and (isinstance(v, (int, float)) or v is None) for n, v in zip(numeric, row)]
                    f.write(json.dumps(texts) + "\n")
                total += len(rows)
        numeric = [n and total > 0 for n in numeric]
        sink.write(_line(columns, widths, numeric) + "\n" + _line(["-" * w for w in widths], widths, numeric) + "\n")
        with cells.open() as f:
            for text in f:
                sink.write(_line(json.loads(text), widths, numeric) + "\n")
        if not total:
            sink.write("(no rows)\n")
    finally:
        cells.unlink(missing_ok=True)
    return total


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        inner = ", ".join(_cell(v) for v in value[:8])
        return f"[{inner}{', ...' if len(value) > 8 else ''}]"
    return str(value)


def _copy(con: duckdb.DuckDBPyConnection, sql: str, fmt: str, path: Path) -> int:
    """COPY the statement's rows to `path`, streaming; returns how many DuckDB wrote."""
    quoted = "'" + str(path).replace("'", "''") + "'"
    return con.execute(f"COPY ({sql}) TO {quoted} {_COPY[fmt]}").fetchall()[0][0]
