"""An export that is cut, lacks a table other tables refer to, or lacks (or mistypes) a column the normalized
tables need is refused with one line naming the file, table and column; an absent table that nsys omits
when empty is fine, and the closing line says which normalized tables came out empty."""
from __future__ import annotations

import io
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from test_ingest_formats import export_tables, write_arrow, write_parquetdir

CUPY = Path(__file__).resolve().parents[2].parent / "shared" / "nsys_samples" / "arrow_2022.4" / "cupy.arrow"


def in_nsys_order(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The tables with PROCESSES last, where nsys writes it."""
    return {**{k: v for k, v in tables.items() if k != "PROCESSES"}, "PROCESSES": tables["PROCESSES"]}


def stream_ends(path: Path) -> list[int]:
    """The byte offset after each stream of an Arrow export."""
    ends = []
    with pa.memory_map(str(path)) as source:
        while source.tell() < source.size():
            for _ in ipc.open_stream(source):
                pass
            ends.append(source.tell())
    return ends


def refused(capsys, source: Path, db: Path) -> str:
    assert main(["ingest", str(source), "--db", str(db), "--quiet"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: ") and captured.out == "", captured.err
    return lines[0]


def test_an_arrow_export_cut_at_any_stream_boundary_is_truncated(tmp_path, target, capsys):
    whole = write_arrow(in_nsys_order(export_tables()), tmp_path / "whole.arrow")
    ends = stream_ends(whole)
    assert len(ends) == len(export_tables())
    data = whole.read_bytes()
    for i, end in enumerate(ends[:-1], start=1):
        cut = tmp_path / f"cut{i}.arrow"
        cut.write_bytes(data[:end])
        line = refused(capsys, cut, target)
        assert f"{cut}: truncated Arrow export: it ends after its {i} tables" in line, line
    assert main(["ingest", str(whole), "--db", str(tmp_path / "whole.duckdb"), "--quiet"]) == 0


@pytest.mark.shared
@pytest.mark.skipif(not CUPY.is_file(), reason=f"{CUPY} not found")
def test_a_real_export_cut_after_stream_14_of_57(tmp_path, target, capsys):
    ends = stream_ends(CUPY)
    assert len(ends) == 57
    cut = tmp_path / "cupy-cut.arrow"
    cut.write_bytes(CUPY.read_bytes()[: ends[13]])
    assert "truncated Arrow export: it ends after its 14 tables (the last ENUM_CUDA_MEMCPY_OPER) without PROCESSES" \
        in refused(capsys, cut, target)


def changed(tmp_path: Path, change) -> Path:
    """The small export as a parquetdir, after `change(tables)` edits its tables in place."""
    tables = export_tables()
    change(tables)
    return write_parquetdir(tables, tmp_path / "capture_pqtdir")


def drop_column(table: str, column: str):
    def change(tables):
        tables[table] = tables[table].drop_columns([column])
    return change


def set_column(table: str, column: str, values: pa.Array):
    def change(tables):
        t = tables[table]
        tables[table] = t.set_column(t.schema.get_field_index(column), column, values)
    return change


def drop_table(name: str):
    return lambda tables: tables.pop(name)


N_EVENTS = 5  # rows of NVTX_EVENTS in the small export
BAD = {
    "no StringIds": (drop_table("StringIds"),
                     "no StringIds table, which 2 rows of NVTX_EVENTS.textId refer to"),
    "no start": (drop_column("NVTX_EVENTS", "start"), "table NVTX_EVENTS has no column start"),
    "no eventType": (drop_column("NVTX_EVENTS", "eventType"), "table NVTX_EVENTS has no column eventType"),
    "no end": (drop_column("NVTX_EVENTS", "end"), "table NVTX_EVENTS has no column end, and it holds ranges"),
    "all-NULL start": (set_column("NVTX_EVENTS", "start", pa.nulls(N_EVENTS, pa.int64())),
                       "column NVTX_EVENTS.start is NULL in all 5 rows"),
    "all-NULL end": (set_column("NVTX_EVENTS", "end", pa.nulls(N_EVENTS, pa.int64())),
                     "column NVTX_EVENTS.end is NULL in all 3 ranges"),
    "no kernel end": (drop_column("CUPTI_ACTIVITY_KIND_KERNEL", "end"),
                      "table CUPTI_ACTIVITY_KIND_KERNEL has no column end"),
    "start as text": (set_column("NVTX_EVENTS", "start", pa.array(["1", "10", "20", "30", "40"])),
                      "column NVTX_EVENTS.start is VARCHAR; nsys writes an integer there"),
    "start as timestamps": (set_column("NVTX_EVENTS", "start", pa.array([1, 10, 20, 30, 40], pa.timestamp("ns"))),
                            "column NVTX_EVENTS.start is TIMESTAMP_NS; nsys writes an integer there"),
    "globalTid as a list": (set_column("NVTX_EVENTS", "globalTid", pa.array([[1]] * N_EVENTS)),
                            "column NVTX_EVENTS.globalTid is BIGINT[]; nsys writes an integer there"),
    "globalTid as binary": (set_column("NVTX_EVENTS", "globalTid", pa.array([b"\x01"] * N_EVENTS)),
                            "column NVTX_EVENTS.globalTid is VARCHAR; nsys writes an integer there"),
    "StringIds.id as text": (set_column("StringIds", "id", pa.array(["0", "1", "2", "3", "4", "5"])),
                             "column StringIds.id is VARCHAR; nsys writes an integer there"),
    "kernel end as text": (set_column("CUPTI_ACTIVITY_KIND_KERNEL", "end", pa.array(["300"])),
                           "column CUPTI_ACTIVITY_KIND_KERNEL.end is VARCHAR; nsys writes an integer there"),
    "utcEpochNs as text": (set_column("TARGET_INFO_SESSION_START_TIME", "utcEpochNs", pa.array(["1700"])),
                           "column TARGET_INFO_SESSION_START_TIME.utcEpochNs is VARCHAR; nsys writes an integer"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_missing_reference_or_a_missing_or_mistyped_column_is_refused(case, tmp_path, target, capsys):
    change, expected = BAD[case]
    source = changed(tmp_path, change)
    line = refused(capsys, source, target)
    assert str(source) in line and expected in line, line


def test_a_table_file_without_columns_is_refused(tmp_path, target, capsys):
    source = changed(tmp_path, lambda tables: None)
    pq.write_table(pa.table({}), source / "OSRT_API.parquet")
    assert "OSRT_API.parquet: table OSRT_API has no columns" in refused(capsys, source, target)


def test_two_tables_whose_names_differ_in_case_are_refused(tmp_path, target, capsys):
    source = changed(tmp_path, lambda tables: None)
    pq.write_table(export_tables()["StringIds"], source / "stringids.parquet")
    assert "table stringids and StringIds are one name to DuckDB" in refused(capsys, source, target)


def test_a_table_name_that_is_not_utf8_is_refused(tmp_path, target, capsys):
    path = write_arrow(in_nsys_order(export_tables()), tmp_path / "capture.arrow")
    table = pa.table({"x": [1]})
    with open(path, "ab") as sink, ipc.new_stream(sink, table.schema.with_metadata({b"table_name": b"T\xff"})) as w:
        w.write_table(table)
    assert "has a table_name that is not UTF-8 (b'T\\xff')" in refused(capsys, path, target)


def test_tables_nsys_omits_when_empty_are_fine_and_the_closing_line_names_what_came_out_empty(tmp_path, capsys):
    def change(tables):
        for name in ("NVTX_EVENTS", "ThreadNames", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
            del tables[name]
    source = changed(tmp_path, change)
    db = tmp_path / "trace.duckdb"
    assert main(["ingest", str(source), "--db", str(db)]) == 0
    closing, note = capsys.readouterr().err.strip().splitlines()[-2:]
    assert closing.endswith("; empty: capture_spans, nvtx_domains, nvtx_categories, nvtx_marks, gpu_ops, "
                            "nvtx_ranges, nvtx_gpu_projection"), closing
    assert note == "itertrace: note: the export holds no ThreadNames table: its 1 thread has no name"
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*), count(name) FROM threads").fetchone() == (1, 0)
        assert con.execute("SELECT count(*) FROM cuda_api").fetchone() == (2,)
