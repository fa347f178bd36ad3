"""One small export written in every layout nsys uses ingests to the same, reproducible database."""
from __future__ import annotations

import io
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from itertrace.ingest import IngestOptions, LoadContext, NsysLoader, Progress, ingest

TID = (1 << 48) | (4242 << 24) | 4243
PID = TID & ~0xFFFFFF
MAX_U64 = 2**64 - 1


def u64(*values): return pa.array(values, pa.uint64())
def u32(*values): return pa.array(values, pa.uint32())
def i64(*values): return pa.array(values, pa.int64())
def text(*values): return pa.array([v.encode() if v is not None else None for v in values], pa.binary())


def export_tables() -> dict[str, pa.Table]:
    """A tiny export typed as nsys 2022.4's Arrow export types it: binary text, mixed integer widths."""
    return {
        "StringIds": pa.table({"id": pa.array([0, 1, 2, 3, 4, 5], pa.int32()),
                               "value": text("step", "forward", "cudaLaunchKernel_v7000", "gemm(float*)", "gemm", "engine")}),
        "ThreadNames": pa.table({"nameId": u64(5), "priority": u64(10), "globalTid": u64(TID)}),
        "PROCESSES": pa.table({"globalPid": u64(PID), "pid": u64(4242), "name": text("python")}),
        "EXPORT_META_DATA": pa.table({"name": text("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION_MAJOR",
                                                   "EXPORT_SCHEMA_VERSION_MINOR", "EXPORT_SCHEMA_VERSION_MICRO"),
                                      "value": text("2022.4.2.1", "3", "0", "0")}),
        "TARGET_INFO_SESSION_START_TIME": pa.table({"utcEpochNs": u64(1_700_000_000_000_000_000),
                                                    "utcTime": text("2023-11-14T22:13:20"), "localTime": text("x")}),
        "NVTX_EVENTS": pa.table({
            "start": i64(1, 10, 20, 30, 40),
            "end": i64(None, 100, 60, None, 45),
            "eventType": u32(75, 59, 59, 34, 59),
            "globalTid": u64(TID, TID, TID, TID, TID),
            "text": pa.array([b"itertrace", None, None, b"arrive", b"bad \xff utf8"], pa.binary()),
            "textId": u32(None, 0, 1, None, None),
            "domainId": u64(1, 1, 1, 1, 0),
            "int64Value": i64(None, 7, None, None, None),
            "uint64Value": u64(None, None, None, MAX_U64, None),
            "doubleValue": pa.array([None, None, None, 0.5, None], pa.float64()),
        }),
        "CUPTI_ACTIVITY_KIND_RUNTIME": pa.table({
            "start": i64(21, 22), "end": i64(25, 26), "eventClass": u32(0, 0), "globalTid": u64(TID, TID),
            "correlationId": u32(11, 12), "nameId": u64(2, 2), "returnValue": u32(0, 0)}),
        "CUPTI_ACTIVITY_KIND_KERNEL": pa.table({
            "start": i64(200), "end": i64(300), "deviceId": u32(0), "contextId": u64(1), "streamId": u64(7),
            "correlationId": u32(11), "globalPid": u64(PID), "demangledName": u64(3), "shortName": u64(4),
            "launchType": u32(1)}),
        "CUPTI_ACTIVITY_KIND_MEMCPY": pa.table({
            "start": i64(310), "end": i64(320), "deviceId": u32(0), "contextId": u64(1), "streamId": u64(7),
            "correlationId": u32(12), "globalPid": u64(PID), "bytes": u64(4096), "copyKind": u64(1)}),
        "ENUM_CUDA_MEMCPY_OPER": pa.table({"id": i64(1), "name": text("CUDA_MEMCPY_KIND_HTOD"), "label": text("Host-to-Device")}),
        "ENUM_CUDA_KRENEL_LAUNCH_TYPE": pa.table({"id": i64(1), "name": text("REGULAR"), "label": text("Regular")}),
    }


def write_arrow(tables: dict[str, pa.Table], path: Path) -> Path:
    with open(path, "wb") as sink:
        for name, table in tables.items():
            with ipc.new_stream(sink, table.schema.with_metadata({"table_name": name})) as writer:
                writer.write_table(table)
    return path


def write_arrowdir(tables: dict[str, pa.Table], folder: Path) -> Path:
    folder.mkdir()
    for i, (name, table) in enumerate(tables.items()):
        new_writer = ipc.new_file if i % 2 else ipc.new_stream  # both IPC formats occur
        with new_writer(folder / f"{name}.arrow", table.schema) as writer:
            writer.write_table(table)
    return folder


def write_parquetdir(tables: dict[str, pa.Table], folder: Path) -> Path:
    folder.mkdir()
    for name, table in tables.items():
        pq.write_table(table, folder / f"{name}.parquet")
    return folder


def contents(db: Path, skip: tuple[str, ...] = ()) -> dict[str, list]:
    """Every table's and view's rows (sorted) and every column comment, keyed by schema.table; not the
    rows of the folded small tables (`_small_tables`), which their views show."""
    with duckdb.connect(str(db), read_only=True) as con:
        names = con.execute("SELECT schema_name, table_name FROM duckdb_tables() WHERE table_name <> '_small_tables' "
                            "UNION ALL SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal "
                            "ORDER BY ALL").fetchall()
        out = {f"{s}.{t}": con.execute(f'SELECT * FROM {s}."{t}" ORDER BY ALL').fetchall()
               for s, t in names if t not in skip}
        out["comments"] = con.execute("SELECT table_name, column_name, comment FROM duckdb_columns() "
                                      "WHERE NOT internal ORDER BY ALL").fetchall()
    return out


@pytest.fixture
def arrow_export(tmp_path) -> Path:
    return write_arrow(export_tables(), tmp_path / "capture.arrow")


def test_every_layout_gives_the_same_tables(tmp_path, arrow_export):
    arrowdir = write_arrowdir(export_tables(), tmp_path / "capture_arrowdir")
    parquetdir = write_parquetdir(export_tables(), tmp_path / "capture_pqtdir")
    results = []
    for source in (arrow_export, arrowdir, parquetdir):
        db = tmp_path / f"{source.name}.duckdb"
        ingest([source], db)
        results.append(contents(db, skip=("capture_meta",)))
    assert results[0] == results[1] == results[2]
    with duckdb.connect(str(tmp_path / "capture_pqtdir.duckdb"), read_only=True) as con:
        assert con.execute("SELECT source_kind, nsys_version, export_schema_version FROM capture_meta").fetchone() == (
            "parquetdir", "2022.4.2.1", "3.0.0")


def test_values_are_resolved(tmp_path, arrow_export):
    db = tmp_path / "trace.duckdb"
    ingest([arrow_export], db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT text, domain_name, int64_value, thread_name, depth FROM nvtx_ranges ORDER BY range_id").fetchall() == [
            ("step", "itertrace", 7, "engine", 0), ("forward", "itertrace", None, "engine", 1),
            ("bad \ufffd utf8", None, None, "engine", 2)]
        assert con.execute("SELECT text, uint64_value, double_value FROM nvtx_marks").fetchall() == [("arrive", MAX_U64, 0.5)]
        assert con.execute("SELECT kind, name, short_name, copy_kind, launch_type FROM gpu_ops ORDER BY start_ns").fetchall() == [
            ("kernel", "gemm(float*)", "gemm", None, "Regular"),
            ("memcpy", "[CUDA memcpy Host-to-Device]", None, "Host-to-Device", None)]
        assert con.execute("SELECT range_id, gpu_start_ns, gpu_end_ns, gpu_op_count FROM nvtx_gpu_projection").fetchall() == [
            (1, 200, 320, 2), (2, 200, 320, 2)]
        assert con.execute("SELECT pid, tid FROM threads").fetchall() == [(4242, 4243)]
        types = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() "
                                 "WHERE schema_name = 'nsys' AND table_name = 'NVTX_EVENTS'").fetchall())
        assert (types["text"], types["globalTid"], types["eventType"]) == ("VARCHAR", "BIGINT", "BIGINT")


def test_ingesting_again_gives_the_same_database(tmp_path, arrow_export):
    ingest([arrow_export], tmp_path / "one.duckdb")
    ingest([arrow_export], tmp_path / "two.duckdb")
    assert contents(tmp_path / "one.duckdb") == contents(tmp_path / "two.duckdb")


def test_small_batches_stream_with_progress(tmp_path, arrow_export):
    stream = io.StringIO()
    progress = Progress(stream, interval_s=0)
    result = ingest([arrow_export], tmp_path / "trace.duckdb", progress=progress)
    assert progress.done == progress.expected == result.rows == sum(t.num_rows for t in export_tables().values())
    assert "100% [" in stream.getvalue() and "building nvtx_ranges" in stream.getvalue()
    ingest([arrow_export], tmp_path / "batched.duckdb", options=IngestOptions(batch_rows=2))
    assert contents(tmp_path / "trace.duckdb") == contents(tmp_path / "batched.duckdb")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal():
    ticks = iter(range(100))
    terminal = Terminal()
    progress = Progress(terminal, clock=lambda: next(ticks))
    progress.expect(200)
    progress.advance(50, "NVTX_EVENTS")
    progress.phase("building nvtx_ranges")
    progress.close()
    assert terminal.getvalue().split("\r")[1:] == [
        "ingest  25% [######..................] 50/200 rows  NVTX_EVENTS",
        "ingest  25% [######..................] 50/200 rows  building nvtx_ranges",
        " " * len("ingest  25% [######..................] 50/200 rows  building nvtx_ranges"), ""]


def test_cli_prints_a_closing_line(tmp_path, arrow_export, capsys):
    assert main(["ingest", str(arrow_export), "--db", str(tmp_path / "t.duckdb")]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("itertrace: ingested 24 rows from 1 source into ") and " rows/s)" in line


class RunLogLoader:
    """A loader of another kind: a folder with run.txt becomes the table run_log."""

    kind = "run"
    accepts = "a run folder (run.txt)"

    def claims(self, path: Path) -> bool:
        return (path / "run.txt").is_file()

    def check(self, paths: list[Path]) -> None:
        pass

    def load(self, path: Path, ctx: LoadContext) -> None:
        lines = (path / "run.txt").read_text().split()
        ctx.con.execute("CREATE TABLE run_log AS SELECT unnest(?::VARCHAR[]) AS line", [lines])

    def finish(self, paths: list[Path], ctx: LoadContext) -> None:
        ctx.con.execute("COMMENT ON TABLE run_log IS 'lines of run.txt'")


def test_another_loader_shares_the_database(tmp_path, arrow_export):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.txt").write_text("a b")
    result = ingest([run, arrow_export], tmp_path / "t.duckdb", loaders=[RunLogLoader(), NsysLoader()])
    assert result.kinds == ("run", "nsys")
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM run_log").fetchone() == (2,)
        assert con.execute("SELECT count(*) FROM nvtx_ranges").fetchone() == (3,)



@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["named-first", "named-last"])
def test_thread_with_several_names_takes_its_highest_priority_one(tmp_path, order):
    # nsys may record several names for a thread; the one of highest priority wins, wherever its row is.
    tables = export_tables()
    rows = [(5, 10), (1, 1)]  # ("engine", priority 10), ("forward", priority 1)
    names, priorities = zip(*(rows[i] for i in order))
    tables["ThreadNames"] = pa.table({"nameId": u64(*names), "priority": u64(*priorities), "globalTid": u64(TID, TID)})
    db = tmp_path / "trace.duckdb"
    ingest([write_arrow(tables, tmp_path / "capture.arrow")], db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT name FROM threads").fetchall() == [("engine",)]
