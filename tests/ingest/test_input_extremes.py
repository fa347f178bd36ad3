"""nsys exports with numbers at the ends of their types, tables of no rows or of ids given twice, and table
files that are no files: an export that cannot be trusted is refused with one line naming the file and
table (status 2, nothing written); a table of no rows is an empty table."""
from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from test_ingest_formats import export_tables, i64, write_arrow, write_parquetdir

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def refused(capsys, *sources: Path, db: Path) -> str:
    """The one error line of an ingest that must fail with status 2."""
    assert main(["ingest", *map(str, sources), "--db", str(db), "--quiet"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: ") and captured.out == "", captured.err
    return lines[0]


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def with_column(tables: dict[str, pa.Table], table: str, column: str, values: pa.Array) -> dict[str, pa.Table]:
    t = tables[table]
    tables[table] = t.set_column(t.schema.get_field_index(column), column, values)
    return tables


@pytest.mark.parametrize("table, column", [
    ("CUPTI_ACTIVITY_KIND_KERNEL", "start"), ("CUPTI_ACTIVITY_KIND_KERNEL", "end"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "end"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "start"), ("NVTX_EVENTS", "start"),
])
@pytest.mark.parametrize("value", [I64_MIN, I64_MAX, 2**62])
def test_a_time_past_what_a_64_bit_difference_holds_is_refused(table, column, value, tmp_path, target, capsys):
    tables = export_tables()
    n = tables[table].num_rows
    tables = with_column(tables, table, column, i64(*[value] * n))
    if column == "start":  # the end after it, so that only the time's size is wrong
        tables = with_column(tables, table, "end", i64(*[I64_MAX if value > 0 else 5] * n))
    folder = write_parquetdir(tables, tmp_path / "export")
    line = refused(capsys, folder, db=target)
    assert line.startswith(f"itertrace: error: {folder}: {table}.{column} {value} ns is past ±2^62 ns"), line


def test_a_kernel_from_int64_min_to_int64_max_is_refused(tmp_path, target, capsys):
    tables = with_column(export_tables(), "CUPTI_ACTIVITY_KIND_KERNEL", "start", i64(I64_MIN))
    tables = with_column(tables, "CUPTI_ACTIVITY_KIND_KERNEL", "end", i64(I64_MAX))
    export = write_arrow(tables, tmp_path / "capture.arrow")
    line = refused(capsys, export, db=target)
    assert line == (f"itertrace: error: {export}: CUPTI_ACTIVITY_KIND_KERNEL.start {I64_MIN} ns is past ±2^62 ns "
                    "(146 years), the range of times itertrace stores (any two must differ by a 64-bit integer)")


@pytest.mark.parametrize("table, what", [
    ("CUPTI_ACTIVITY_KIND_KERNEL", "1 row of CUPTI_ACTIVITY_KIND_KERNEL ends"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "1 row of CUPTI_ACTIVITY_KIND_MEMCPY ends"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "2 rows of CUPTI_ACTIVITY_KIND_RUNTIME end"),
])
def test_gpu_work_or_a_call_that_ends_before_it_starts_is_refused(table, what, tmp_path, target, capsys):
    tables = export_tables()
    starts = tables[table].column("start").to_pylist()
    tables = with_column(tables, table, "end", i64(*[s - 1 for s in starts]))
    folder = write_parquetdir(tables, tmp_path / "export")
    line = refused(capsys, folder, db=target)
    assert line == (f"itertrace: error: {folder}: {what} before {'it starts' if 'row of' in what else 'they start'} "
                    f"(the first: start {starts[0]}, end {starts[0] - 1})")


def test_an_nvtx_range_that_ends_before_it_starts_is_refused_and_a_mark_is_not_a_range(tmp_path, target, capsys):
    tables = with_column(export_tables(), "NVTX_EVENTS", "end", i64(None, 5, 60, 29, 45))  # the mark's end is ignored
    folder = write_parquetdir(tables, tmp_path / "export")
    line = refused(capsys, folder, db=target)
    assert line == (f"itertrace: error: {folder}: 1 range of NVTX_EVENTS ends before it starts "
                    "(the first: start 10, end 5)")


@pytest.mark.parametrize("table", ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                   "CUPTI_ACTIVITY_KIND_MEMCPY", "StringIds", "ThreadNames", "ENUM_CUDA_MEMCPY_OPER"])
def test_a_table_of_no_rows_is_an_empty_table(table, tmp_path, capsys):
    tables = export_tables()
    tables[table] = tables[table].slice(0, 0)
    if table == "StringIds":  # ids pointing into it are refused as into a missing table: here none do
        del tables["ThreadNames"]
        for name in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"):
            for column in ("textId", "nameId", "demangledName", "shortName"):
                if column in tables[name].column_names:
                    tables = with_column(tables, name, column, pa.nulls(tables[name].num_rows, pa.int64()))
    folder = write_parquetdir(tables, tmp_path / "export")
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(folder), "--db", str(db), "--quiet"]) == 0, capsys.readouterr().err
    assert rows(db, f'SELECT count(*) FROM nsys."{table}"') == [(0,)]


def test_ids_into_a_string_table_of_no_rows_are_refused_as_into_none(tmp_path, target, capsys):
    tables = export_tables()
    tables["StringIds"] = tables["StringIds"].slice(0, 0)
    folder = write_parquetdir(tables, tmp_path / "export")
    line = refused(capsys, folder, db=target)
    assert line == (f"itertrace: error: {folder}: StringIds holds no rows, which 2 rows of NVTX_EVENTS.textId refer to "
                    "(their names would all be missing)")


@pytest.mark.parametrize("table", ["StringIds", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_KRENEL_LAUNCH_TYPE"])
def test_an_id_given_twice_in_a_table_of_names_is_refused(table, tmp_path, target, capsys):
    tables = export_tables()
    tables[table] = pa.concat_tables([tables[table], tables[table].slice(0, 1)])
    folder = write_parquetdir(tables, tmp_path / "export")
    line = refused(capsys, folder, db=target)
    first = tables[table].column("id")[0].as_py()
    assert line == (f"itertrace: error: {folder}: {table} holds id {first} in 2 rows (1 id appears more than once); "
                    "each id must name one row")


def test_a_column_with_no_name_is_refused(tmp_path, target, capsys):
    tables = export_tables()
    tables["StringIds"] = tables["StringIds"].append_column("", pa.array(["x"] * tables["StringIds"].num_rows))
    folder = write_parquetdir(tables, tmp_path / "export")
    line = refused(capsys, folder, db=target)
    assert line == f"itertrace: error: {folder / 'StringIds.parquet'}: table StringIds has a column with no name"


def test_two_columns_that_are_one_name_to_duckdb_are_refused(tmp_path, target, capsys):
    tables = export_tables()
    tables["StringIds"] = tables["StringIds"].append_column("VALUE", pa.array(["x"] * tables["StringIds"].num_rows))
    export = write_arrow(tables, tmp_path / "capture.arrow")
    line = refused(capsys, export, db=target)
    assert line == f"itertrace: error: {export}: table StringIds has columns value and VALUE, one name to DuckDB"


@pytest.mark.parametrize("table", ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds", "PROCESSES"])
@pytest.mark.parametrize("kind, why", [
    ("fifo", "a FIFO, not a table file"),
    ("folder", "a folder, not a table file"),
    ("dangling", "a symbolic link to {dest}, which does not exist"),
    ("loop", "a symbolic link that loops"),
])
@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_table_file_that_is_no_file_is_refused(table, kind, why, suffix, tmp_path, target, capsys):
    folder = write_parquetdir(export_tables(), tmp_path / "export")
    if suffix == ".arrow":
        for file in list(folder.iterdir()):
            write_arrow({file.stem: pq.read_table(file)}, file.with_suffix(".arrow"))
            file.unlink()
    file = folder / f"{table}{suffix}"
    file.unlink()
    dest = tmp_path / "gone" / "x.parquet"
    {"fifo": lambda: os.mkfifo(file), "folder": file.mkdir, "dangling": lambda: file.symlink_to(dest),
     "loop": lambda: file.symlink_to(file.name)}[kind]()
    line = refused(capsys, folder, db=target)
    assert line == f"itertrace: error: {file}: {why.format(dest=dest)}"


def test_a_table_file_behind_a_symbolic_link_is_read(tmp_path, capsys):
    folder = write_parquetdir(export_tables(), tmp_path / "export")
    aside = tmp_path / "aside.parquet"
    (folder / "NVTX_EVENTS.parquet").rename(aside)
    (folder / "NVTX_EVENTS.parquet").symlink_to(aside)
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(folder), "--db", str(db), "--quiet"]) == 0, capsys.readouterr().err
    assert rows(db, "SELECT count(*) FROM nsys.NVTX_EVENTS") == [(5,)]


@pytest.mark.parametrize("name", ["run.json", "events.parquet"])
def test_a_run_file_that_is_a_fifo_says_so(name, tmp_path, target, capsys):
    run = tmp_path / "run"
    assert main(["run", "--workload", "worked-example", "--out", str(run)]) == 0
    capsys.readouterr()
    (run / name).unlink()
    os.mkfifo(run / name)
    line = refused(capsys, run, db=target)
    assert line == f"itertrace: error: {run / name}: a FIFO, not a file"


@pytest.mark.parametrize("kind, why", [("fifo", "a FIFO, not a file or folder"),
                                       ("dangling", "a symbolic link to {dest}, which does not exist"),
                                       ("loop", "a symbolic link that loops")])
@pytest.mark.parametrize("name", ["capture.arrow", "trace.json.gz", "report.nsys-rep"])
def test_a_source_that_is_no_file_says_what_it_is(kind, why, name, tmp_path, target, capsys):
    source, dest = tmp_path / name, tmp_path / "gone" / name
    {"fifo": lambda: os.mkfifo(source), "dangling": lambda: source.symlink_to(dest),
     "loop": lambda: source.symlink_to(source.name)}[kind]()
    assert refused(capsys, source, db=target) == f"itertrace: error: {source}: {why.format(dest=dest)}"
