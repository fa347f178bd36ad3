"""Bad input: one line naming the file and the problem, exit status 2, and no database file left behind."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from export_closing import closing_tables
from itertrace.cli import main

NEWER_REPORT = (Path(__file__).resolve().parents[2].parent / "shared" / "nsys_samples" / "newer_nsys_rep"
                / "pytorch_lm_nsys2026.1.nsys-rep")


def small_export(path: Path) -> Path:
    """A small Arrow export in nsys's layout: concatenated IPC streams named by `table_name`."""
    tables = {"StringIds": pa.table({"id": pa.array(range(2000), pa.int32()),
                                     "value": pa.array([f"s{i}".encode() for i in range(2000)], pa.binary())}),
              "NVTX_EVENTS": pa.table({"start": pa.array([1], pa.int64()), "end": pa.array([2], pa.int64()),
                                       "eventType": pa.array([59], pa.uint32()), "globalTid": pa.array([5], pa.uint64())})}
    with open(path, "wb") as sink:
        for name, table in {**tables, **closing_tables()}.items():
            with ipc.new_stream(sink, table.schema.with_metadata({"table_name": name})) as writer:
                writer.write_table(table)
    return path


def fails(capsys, *argv: str) -> str:
    """Run `itertrace` and return its one error line, checking the status and that nothing else was printed."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: "), captured.err
    assert captured.out == ""
    return lines[0]


def test_truncated_arrow_export(tmp_path, target, capsys):
    whole = small_export(tmp_path / "whole.arrow").read_bytes()
    for size in (len(whole) // 2, len(whole) - 4, 100):
        cut = tmp_path / f"cut{size}.arrow"
        cut.write_bytes(whole[:size])
        line = fails(capsys, "ingest", str(cut), "--db", str(target))
        assert str(cut) in line and "truncated" in line


def test_corrupt_stream_inside_a_complete_looking_file(tmp_path, target, capsys):
    whole = bytearray(small_export(tmp_path / "whole.arrow").read_bytes())
    whole[8:40] = b"\x00" * 32  # the first schema message, garbled; the end-of-stream marker intact
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(bytes(whole))
    line = fails(capsys, "ingest", str(bad), "--db", str(target))
    assert str(bad) in line and ("corrupt" in line or "table_name" in line)


def test_empty_export(tmp_path, target, capsys):
    (tmp_path / "empty.arrow").touch()
    line = fails(capsys, "ingest", str(tmp_path / "empty.arrow"), "--db", str(target))
    assert "empty.arrow: empty file" in line


def test_folder_with_no_tables(tmp_path, target, capsys):
    empty = tmp_path / "export_dir"
    empty.mkdir()
    assert "export_dir: folder is empty" in fails(capsys, "ingest", str(empty), "--db", str(target))
    (empty / "README.txt").write_text("not a table")
    line = fails(capsys, "ingest", str(empty), "--db", str(target))
    assert "export_dir: folder holds no tables" in line


def test_corrupt_table_in_a_parquetdir(tmp_path, target, capsys):
    folder = tmp_path / "pqtdir"
    folder.mkdir()
    pq.write_table(pa.table({"id": [1], "value": ["x"]}), folder / "StringIds.parquet")
    whole = (folder / "StringIds.parquet").read_bytes()
    (folder / "NVTX_EVENTS.parquet").write_bytes(whole[: len(whole) // 2])
    line = fails(capsys, "ingest", str(folder), "--db", str(target))
    assert "NVTX_EVENTS.parquet" in line and "corrupt" in line


def test_sqlite_export_gets_the_command_that_makes_an_arrow_export(tmp_path, target, capsys):
    sqlite = tmp_path / "report.sqlite"
    sqlite.write_bytes(b"SQLite format 3\x00")
    line = fails(capsys, "ingest", str(sqlite), "--db", str(target))
    stem = tmp_path / "report"
    assert f"`nsys export --type arrow -o {stem}.arrow {stem}.nsys-rep`" in line


@pytest.mark.shared
@pytest.mark.skipif(not NEWER_REPORT.is_file(), reason=f"{NEWER_REPORT} not found")
@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not installed: no installed version to compare")
def test_report_from_a_newer_nsys(target, capsys):
    from itertrace.ingest.nsys import find_nsys

    installed = find_nsys().version
    line = fails(capsys, "ingest", str(NEWER_REPORT), "--db", str(target))
    assert str(NEWER_REPORT) in line
    assert f"written by Nsight Systems 2026.1.2, newer than the installed {installed}" in line


def test_file_that_is_no_report(tmp_path, target, capsys):
    fake = tmp_path / "fake.nsys-rep"
    fake.write_bytes(b"PK\x03\x04 a zip file")
    assert "fake.nsys-rep: not an Nsight Systems report" in fails(capsys, "ingest", str(fake), "--db", str(target))


def test_unknown_source_type(tmp_path, target, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    line = fails(capsys, "ingest", str(notes), "--db", str(target))
    assert "notes.txt: unknown source type '.txt'; expected an Nsight Systems report (.nsys-rep)" in line
    assert "no such file" in fails(capsys, "ingest", str(tmp_path / "missing.arrow"), "--db", str(target))


def test_two_captures_in_one_database(tmp_path, target, capsys):
    one, two = small_export(tmp_path / "one.arrow"), small_export(tmp_path / "two.arrow")
    assert "holds one nsys capture" in fails(capsys, "ingest", str(one), str(two), "--db", str(target))


def test_missing_db_flag(tmp_path, capsys):
    line = fails(capsys, "ingest", str(small_export(tmp_path / "x.arrow")))
    assert "--db" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.arrow"]


@pytest.mark.parametrize("how", ["duckdb", "arrow scan"])
def test_ctrl_c_inside_a_duckdb_query_is_one_line_and_leaves_the_old_database(tmp_path, target, capsys,
                                                                              monkeypatch, how):
    """DuckDB turns Ctrl-C during a query into its own error (InterruptException; RuntimeError from an
    Arrow scan), not KeyboardInterrupt: the CLI still says `interrupted`, exits 130 and removes its work."""
    import threading

    from itertrace.ingest import nsys_loader

    def interrupted_write(ctx, sources, tables, drop_volatile):  # while nsys's tables are written
        if how == "arrow scan":
            raise RuntimeError("Query interrupted")
        threading.Timer(0.1, ctx.con.interrupt).start()
        ctx.con.execute("SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3").fetchall()

    monkeypatch.setattr(nsys_loader, "store_raw_tables", interrupted_write)
    assert main(["ingest", str(small_export(tmp_path / "export.arrow")), "--db", str(target), "--quiet"]) == 130
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == ["itertrace: interrupted"] and captured.out == ""
