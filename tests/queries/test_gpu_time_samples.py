"""gpu_time on real GPU captures: busy time per GPU is the union of its GPU work, computed here in plain Python.

The union is taken from the raw nsys tables (the kernel, memcpy and memset tables, by deviceId and
globalPid) with a sort and a running end, not from gpu_ops; the window from the raw GPU tables. Every capture's parts add up to its window, and every idle span's parts to the span.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from gpu_time_reference import union_ns

from itertrace.ingest import ingest
from itertrace.queries import QueryDB

SAMPLES = Path(__file__).parents[2] / ".." / "shared" / "nsys_samples"
NAMES = ("h100_2gpu_1s_pqtdir", "mfu_2gpu_before_pqtdir", "mfu_2gpu_after_pqtdir", "cloverleaf_4gpu_pqtdir")
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"real nsys exports not found at {SAMPLES.resolve()}"),
]


@pytest.fixture(scope="module", params=NAMES)
def sample(request, tmp_path_factory):
    db = tmp_path_factory.mktemp("gpu_time") / f"{request.param}.duckdb"
    ingest([SAMPLES / request.param], db)
    with QueryDB(db) as queries:  # the default mapping: auto
        yield queries


def raw(db: QueryDB, sql: str) -> list[tuple]:
    return db.con.execute(sql).fetchall()


def raw_gpu_work(db: QueryDB) -> dict[tuple[int, int], list[tuple[int, int]]]:
    present = {r[0] for r in raw(db, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'nsys'")}
    work = defaultdict(list)
    for table in GPU_TABLES:
        if table in present:
            for device, pid, start, end in raw(db, f'SELECT deviceId, globalPid, start, "end" FROM nsys.{table}'):
                work[device, pid].append((start, end))
    return work


def test_busy_per_gpu_is_the_union_of_its_work(sample):
    work = raw_gpu_work(sample)
    got = {(r["device_id"], r["global_pid"]): r for r in sample.query("gpu_time").to_pylist()}
    assert set(got) == set(work)
    for key, intervals in work.items():
        assert got[key]["busy_ns"] == union_ns(intervals), key
        assert got[key]["gpu_ops"] == len(intervals)
        assert 0 < got[key]["busy_ns"] <= sum(e - s for s, e in intervals)


def test_the_window_is_split_exactly(sample):
    """Each GPU's window is its work's first start to last end (an nsys export does not say whether its
    collection was a capture range or the whole session), and its parts add up to it."""
    work = raw_gpu_work(sample)
    for row in sample.query("gpu_time").to_pylist():
        intervals = work[row["device_id"], row["global_pid"]]
        assert (row["window_start_ns"], row["window_end_ns"], row["window_source"]) == (
            min(s for s, _ in intervals), max(e for _, e in intervals), "GPU work")
        assert row["window_ns"] == row["busy_ns"] + row["idle_ns"]
        assert row["idle_ns"] == row["idle_within_ns"] + row["idle_between_ns"] + row["idle_outside_ns"]
    spans = {(r["device_id"], r["global_pid"], r["start_ns"]): r["dur_ns"]
             for r in sample.query("gpu_time_idle").to_pylist()}
    parts = defaultdict(int)
    for r in sample.query("gpu_idle_parts").to_pylist():
        parts[r["device_id"], r["global_pid"], r["idle_start_ns"]] += r["dur_ns"]
        assert r["dur_ns"] >= 0
    assert parts == spans
    idle = {(r["device_id"], r["global_pid"]): r["idle_ns"] for r in sample.query("gpu_time").to_pylist()}
    by_gpu = defaultdict(int)
    for (device, pid, _), ns in spans.items():
        by_gpu[device, pid] += ns
    assert by_gpu == idle


def test_the_summary_has_one_row_per_gpu_with_shares_that_add_up(sample):
    for row in sample.query("gpu_time_summary").to_pylist():
        shares = row["busy_share"] + row["idle_within_share"] + row["idle_between_share"] + row["idle_outside_share"]
        assert shares == pytest.approx(1.0, abs=1e-12)
        assert row["top_cause"] and len(row["top_causes"]) == 3
