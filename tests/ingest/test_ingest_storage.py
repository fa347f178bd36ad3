"""nsys's tables as stored by nsys_store: each view gives back exactly the rows and values of the export.

Checked against the export read with pyarrow alone (values decoded in plain Python), for hand-made
exports that hit every way a raw value can hide behind a normalized one, and for every real sample.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from export_closing import closing_tables
from test_ingest_formats import write_arrow, write_parquetdir
from test_ingest_samples import EXPORTS, read_tables

from itertrace.cli import main
from itertrace.ingest import ingest, nsys_store

TID = (1 << 48) | (77 << 24) | 78
MAX_U64 = 2**64 - 1


def text(*values):
    return pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary())


def tricky_export() -> dict[str, pa.Table]:
    """Raw rows whose values the normalized tables hold only in part, or change on the way."""
    return {
        "StringIds": pa.table({"id": pa.array([1, 2, 3], pa.uint32()), "value": text("registered", "kernel", "launch")}),
        "NVTX_EVENTS": pa.table({
            "start": pa.array([1, 2, 3, 4, 5, 6, 7, 8], pa.int64()),
            "end": pa.array([10, 9, None, None, 6, 8, 7, None], pa.int64()),
            # a domain's name, a push/pop range, its NVTXT twin, a mark, a start/end range, a category, ...
            "eventType": pa.array([75, 59, 70, 34, 60, 59, 33, 34], pa.uint32()),
            "text": text("dom", None, "inline", None, "both", b"bad \xff", "cat", "mark"),
            "textId": pa.array([None, 1, None, 1, 1, None, None, None], pa.uint32()),  # registered, or both
            "globalTid": pa.array([TID] * 8, pa.uint64()),
            "endGlobalTid": pa.array([None, None, None, None, TID + 1, None, None, None], pa.uint64()),
            "domainId": pa.array([1, 1, None, 0, 1, None, 1, 1], pa.uint64()),  # NULL is not 0 in the raw table
            "category": pa.array([None, 2, None, None, None, None, 2, None], pa.uint32()),
            "uint64Value": pa.array([None, MAX_U64, 2**63, None, None, None, None, 5], pa.uint64()),
            "int64Value": pa.array([None, -1, None, 7, None, None, None, None], pa.int64()),
            "floatValue": pa.array([None, 0.5, None, None, None, None, None, 0.25], pa.float32()),
            "doubleValue": pa.array([None, None, 0.1, None, None, None, None, None], pa.float64()),
            "binaryData": text(None, None, None, b"\x00\x01", None, None, None, None),  # a column no table reads
        }),
        "CUPTI_ACTIVITY_KIND_RUNTIME": pa.table({
            "start": pa.array([20, 21, 30], pa.int64()), "end": pa.array([25, 26, 31], pa.int64()),
            "eventClass": pa.array([0, 67, 0], pa.uint32()),  # a backtrace row: no cuda_api row holds it
            "globalTid": pa.array([TID] * 3, pa.uint64()), "correlationId": pa.array([5, 5, 6], pa.uint32()),
            "nameId": pa.array([3, 3, 3], pa.uint32()), "returnValue": pa.array([0, 0, 1], pa.uint32())}),
        "CUPTI_ACTIVITY_KIND_KERNEL": pa.table({
            "start": pa.array([40], pa.int64()), "end": pa.array([50], pa.int64()), "deviceId": pa.array([0], pa.uint32()),
            "streamId": pa.array([7], pa.uint32()), "correlationId": pa.array([5], pa.uint32()),
            "globalPid": pa.array([TID & ~0xFFFFFF], pa.uint64()), "demangledName": pa.array([2], pa.uint32()),
            "gridX": pa.array([128], pa.int32())}),
        "CUPTI_ACTIVITY_KIND_MEMCPY": pa.table({
            "start": pa.array([60], pa.int64()), "end": pa.array([61], pa.int64()), "deviceId": pa.array([0], pa.uint32()),
            "streamId": pa.array([7], pa.uint32()), "correlationId": pa.array([6], pa.uint32()),
            "globalPid": pa.array([TID & ~0xFFFFFF], pa.uint64()), "bytes": pa.array([4096], pa.uint64()),
            "copyKind": pa.array([1], pa.uint8())}),
        "ENUM_CUDA_MEMCPY_OPER": pa.table({"id": pa.array([1], pa.int64()), "name": text("HTOD"), "label": text("Host-to-Device")}),
        "TARGET_INFO_GPU": pa.table({"id": pa.array([0], pa.int64()), "busLocation": text("0000:01:00.0"),
                                     "clockRate": pa.array([1.5e9], pa.float64())}),
        # flags as booleans, and one text value longer than a DuckDB string outside ZSTD fits in well
        "OSRT_CALLCHAINS": pa.table({"id": pa.array([1, 1, 2], pa.uint32()), "symbol": pa.array([4, 5, 4], pa.uint32()),
                                     "kernelMode": pa.array([True, None, False]), "stackDepth": pa.array([0, 1, 0], pa.uint8())}),
        "TARGET_INFO_SYSTEM_ENV": pa.table({"name": text("CpuInfo", "GpuMetricsConfig"),
                                            "value": text("{}", "metric: x\n" * 4000)}),
    }


def plain(value):
    """A raw value as the database keeps it: text decoded (bad bytes replaced), uint64 as int64 bit for bit."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, int) and value >= 2**63:
        return value - 2**64
    return value


def expected_rows(raw: list[dict]) -> Counter:
    return Counter(tuple(plain(v) for v in row.values()) for row in raw)


def stored_rows(con: duckdb.DuckDBPyConnection, table: str) -> Counter:
    return Counter(con.execute(f'SELECT * FROM nsys."{table}"').fetchall())


def same(got: Counter, want: Counter) -> bool:
    """Equal multisets of rows, NaN equal to NaN."""
    def key(row):
        return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row)
    return Counter({key(r): n for r, n in got.items()}) == Counter({key(r): n for r, n in want.items()})


def check_export(con: duckdb.DuckDBPyConnection, raw: dict[str, list[dict]]) -> None:
    names = {n for (n,) in con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'nsys' "
                                       "AND table_name NOT LIKE '\\_%' ESCAPE '\\'").fetchall()}
    assert names == set(raw)
    for table, rows in raw.items():
        assert same(stored_rows(con, table), expected_rows(rows)), table
        columns = [c for (c,) in con.execute(f'SELECT column_name FROM (DESCRIBE nsys."{table}")').fetchall()]
        assert columns == (list(rows[0]) if rows else columns), table  # nsys's column order


@pytest.mark.parametrize("layout", ["arrow", "parquetdir"])
def test_views_give_back_every_raw_value(tmp_path, layout):
    tables = {**tricky_export(), **closing_tables()}  # an Arrow export ends with these
    source = (write_arrow(tables, tmp_path / "x.arrow") if layout == "arrow"
              else write_parquetdir(tables, tmp_path / "x_pqtdir"))
    db = tmp_path / "trace.duckdb"
    ingest([source], db)
    with duckdb.connect(str(db), read_only=True) as con:
        check_export(con, {name: table.to_pylist() for name, table in tables.items()})
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                 "WHERE table_schema = 'nsys'").fetchall())
        assert kinds["NVTX_EVENTS"] == kinds["ENUM_CUDA_MEMCPY_OPER"] == "VIEW"
        assert kinds["_NVTX_EVENTS"] == kinds["_small_tables"] == "BASE TABLE"
        assert kinds["OSRT_CALLCHAINS"] == kinds["TARGET_INFO_SYSTEM_ENV"] == "VIEW"
        types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE nsys.OSRT_CALLCHAINS)").fetchall())
        assert types == {"id": "BIGINT", "symbol": "BIGINT", "kernelMode": "BOOLEAN", "stackDepth": "BIGINT"}
        # only the slot holding the long value is in ZSTD
        zstd = {c for (c,) in con.execute("SELECT DISTINCT column_name FROM pragma_storage_info('nsys._small_tables') "
                                          "WHERE compression = 'ZSTD'").fetchall()}
        assert len(zstd) == 1 and con.execute(f"SELECT count(*) FROM nsys._small_tables WHERE strlen({zstd.pop()}) > {nsys_store.LONG_TEXT}"
                                               ).fetchone() == (1,)
        # the hidden table keeps no column that would hold only NULLs (binaryData has a value)
        hidden = {c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = '_NVTX_EVENTS'").fetchall()}
        assert {"binaryData", "textId", "_text_null"} <= hidden and not {"color", "jsonText"} & hidden
        # the normalized tables still hold what they hold
        assert con.execute("SELECT text, int64_value, uint64_value FROM nvtx_ranges ORDER BY range_id").fetchall() == [
            ("registered", -1, MAX_U64), ("inline", None, 2**63), ("both", None, None), ("bad \ufffd", None, None)]
        assert con.execute("SELECT count(*) FROM cuda_api").fetchone() == (2,)


def test_a_table_over_the_small_limit_is_a_table(tmp_path, monkeypatch):
    monkeypatch.setattr(nsys_store, "SMALL_ROWS", 0)
    tables = {**tricky_export(), **closing_tables()}  # an Arrow export ends with these
    db = tmp_path / "trace.duckdb"
    ingest([write_arrow(tables, tmp_path / "x.arrow")], db)
    with duckdb.connect(str(db), read_only=True) as con:
        check_export(con, {name: table.to_pylist() for name, table in tables.items()})
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                 "WHERE table_schema = 'nsys'").fetchall())
        assert kinds["StringIds"] == kinds["TARGET_INFO_GPU"] == "BASE TABLE" and "_small_tables" not in kinds


@pytest.mark.shared
@pytest.mark.skipif(not EXPORTS, reason="real nsys exports not found in ../shared/nsys_samples")
@pytest.mark.parametrize("export", EXPORTS, ids=lambda p: p.name)
def test_views_give_back_every_real_export(tmp_path, export: Path):
    db = tmp_path / "trace.duckdb"
    ingest([export], db)
    with duckdb.connect(str(db), read_only=True) as con:
        check_export(con, read_tables(export))


def test_out_of_memory_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    # DuckDB spills rather than fail at the least limit taken (64 MiB held a million ranges), so the
    # failure is raised where it would come from: building the normalized tables of a capture.
    from itertrace.ingest import nsys_loader

    def out_of_memory(*args, **kwargs):
        raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block of size 256.0 KiB")

    monkeypatch.setattr(nsys_loader, "build_normalized_over", out_of_memory)
    source = write_arrow({**tricky_export(), **closing_tables()}, tmp_path / "x.arrow")
    target = tmp_path / "t.duckdb"
    assert main(["ingest", str(source), "--db", str(target), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"itertrace: error: {source}: DuckDB ran out of memory under the default --memory-limit 512MB "
                     "(Out of Memory Error: could not allocate block of size 256.0 KiB); give it more with "
                     f"--memory-limit; {target} is unchanged"], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.arrow"]
