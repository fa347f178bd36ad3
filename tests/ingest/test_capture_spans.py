"""capture_spans: the span each process's capture recorded, from the PyTorch profiler's Trace event and its
ProfilerStep#N annotations, and from nsys's ANALYSIS_DETAILS."""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from test_kineto_shapes import ingested, span

from itertrace.ingest import ingest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def test_kineto_trace_span_for_every_process_and_steps_where_they_are(tmp_path):
    con = ingested(tmp_path, {"traceEvents": [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": 1, "dur": 99, "args": {"Op count": 0}},
        span("ProfilerStep#7", 10, 20), span("ProfilerStep#8", 30, 25), span("ProfilerStep#8b", 2, 90),
        span("aten::mm", 12, 1, cat="cpu_op"),
        span("step", 20, 5, pid=20, tid=21),
    ]})
    assert con.execute("SELECT (global_pid >> 24) & 16777215, start_ns, end_ns, source FROM capture_spans "
                       "ORDER BY ALL").fetchall() == [
        (10, 1000, 100_000, "kineto trace span"), (10, 10_000, 55_000, "kineto profiler steps"),
        (20, 1000, 100_000, "kineto trace span")]


def test_kineto_trace_without_spans_has_none(tmp_path):
    con = ingested(tmp_path, {"traceEvents": [span("step", 20, 5)]})
    assert con.execute("SELECT count(*) FROM capture_spans").fetchall() == [(0,)]


@pytest.mark.shared
def test_kineto_sample_spans_as_its_json_gives_them(tmp_path):
    trace = SHARED / "kineto_samples" / "resnet_v100_ns_rank0.json.gz"
    if not trace.is_file():
        pytest.skip(f"{trace} not found")
    events = json.loads(gzip.decompress(trace.read_bytes()), parse_float=Decimal)["traceEvents"]

    def ns(us) -> int:
        return int(Decimal(us) * 1000)

    (profiler,) = [e for e in events if e.get("cat") == "Trace"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    ingest([trace], tmp_path / "t.duckdb")
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:
        assert con.execute("SELECT (global_pid >> 24) & 16777215, start_ns, end_ns, source FROM capture_spans "
                           "ORDER BY source").fetchall() == [
            (steps[0]["pid"], min(ns(e["ts"]) for e in steps), max(ns(e["ts"]) + ns(e["dur"]) for e in steps),
             "kineto profiler steps"),
            (steps[0]["pid"], ns(profiler["ts"]), ns(profiler["ts"]) + ns(profiler["dur"]), "kineto trace span")]


@pytest.mark.shared
def test_nsys_collection_for_every_process(tmp_path):
    export = SHARED / "nsys_samples" / "cloverleaf_4gpu_pqtdir"
    if not export.is_dir():
        pytest.skip(f"{export} not found")
    with duckdb.connect() as raw:
        (duration,), = raw.execute(f"SELECT duration FROM '{export}/ANALYSIS_DETAILS.parquet'").fetchall()
        pids = {p for (p,) in raw.execute(f"SELECT globalPid FROM '{export}/PROCESSES.parquet'").fetchall()}
    ingest([export], tmp_path / "t.duckdb")
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:
        spans = con.execute("SELECT global_pid, start_ns, end_ns, source FROM capture_spans").fetchall()
        processes = {p for (p,) in con.execute("SELECT global_pid FROM processes").fetchall()}
        kernels = con.execute("SELECT min(start_ns), max(end_ns) FROM gpu_ops").fetchall()[0]
    assert processes >= pids and sorted(spans) == sorted((p, 0, duration, "nsys collection") for p in processes)
    assert 0 <= kernels[0] and kernels[1] <= duration  # the GPU work lies inside, on the same clock
