"""Kineto ingest on small traces written here: the JSON layouts a splitter must survive, and how events map."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import duckdb
import pytest

import itertrace.ingest.kineto_json as kj
from itertrace.ingest import ingest
from itertrace.ingest.kineto_json import split_trace


def span(name: str, ts, dur, *, cat: str = "user_annotation", pid: int = 10, tid: int = 11, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write(path: Path, document, *, raw: str | None = None) -> Path:
    text = raw if raw is not None else json.dumps(document, indent=1)
    path.write_bytes(gzip.compress(text.encode()) if path.name.endswith(".gz") else text.encode())
    return path


AWKWARD = {
    "schemaVersion": 1,
    "note": 'a "traceEvents": [ in a string, ] { } and \\"escapes\\" \\\\',
    "deviceProperties": [{"id": 0, "name": "[GPU] {0}"}],
    "traceEvents": [
        span('quote " bracket ] brace } backslash \\', 1.5, 2),
        span("\\\\]\\\"", 4, 1, note="[[[{{{"),
        {"ph": "M", "name": "thread_name", "pid": 10, "tid": 11, "args": {"name": "main ]"}},
        span("unicode \u00e9 \u2603", 6, 1),
    ],
    "INFO": ["]", "}", "traceEvents"],
    "baseTimeNanoseconds": 1700000000000000000,
}


@pytest.mark.parametrize("chunk", [3, 7, 64, 1 << 20])
@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_split_keeps_events_and_keys_at_any_chunk_size(tmp_path, monkeypatch, chunk, name):
    for attr in ("CHUNK_BYTES", "FIRST_CHUNK_BYTES", "BLOCK_BYTES"):
        monkeypatch.setattr(kj, attr, chunk)
    source = write(tmp_path / name, AWKWARD)
    split = split_trace(source, tmp_path / "events.json")
    assert json.loads((tmp_path / "events.json").read_text()) == AWKWARD["traceEvents"]
    assert split.meta == {k: v for k, v in AWKWARD.items() if k != "traceEvents"}


@pytest.mark.parametrize("raw", [
    '[{"ph": "X", "name": "a"}, {"ph": "i", "name": "]"}]',  # Chrome's JSON Array Format: all events
    '\ufeff {"traceEvents": [{"ph": "X", "name": "a"}, {"ph": "i", "name": "]"}]}',
    '{"traceEvents":[{"ph":"X","name":"a"},{"ph":"i","name":"]"}],"displayTimeUnit":"ns"}',
])
def test_split_layouts(tmp_path, raw):
    split = split_trace(write(tmp_path / "t.json", None, raw=raw), tmp_path / "events.json")
    assert json.loads((tmp_path / "events.json").read_text()) == [{"ph": "X", "name": "a"}, {"ph": "i", "name": "]"}]
    assert split.meta == ({"displayTimeUnit": "ns"} if "displayTimeUnit" in raw else {})


def ingested(tmp_path: Path, *documents: dict) -> duckdb.DuckDBPyConnection:
    """The documents ingested into one database; a string "=N" in them is written as the number N, digit for digit."""
    paths = [write(tmp_path / f"rank{i}.json", None, raw=re.sub(r'"=([0-9.]+)"', r"\1", json.dumps(d)))
             for i, d in enumerate(documents)]
    ingest(paths, tmp_path / "t.duckdb")
    return duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)


def test_nesting_of_touching_equal_and_empty_ranges(tmp_path):
    con = ingested(tmp_path, {"traceEvents": [
        span("outer", 0, 10), span("a", 0, 5), span("b", 5, 5),  # a and b touch: siblings under outer
        span("same", 20, 4), span("same-inner", 20, 4),  # equal spans: the first one given is the parent
        span("empty", 30, 0), span("after-empty", 30, 2),  # empty at the start of another: its sibling
        span("other-thread", 1, 2, tid=12),
    ]})
    got = con.execute("""SELECT r.text, r.depth, p.text FROM nvtx_ranges AS r
                         LEFT JOIN nvtx_ranges AS p ON p.range_id = r.parent_range_id ORDER BY r.range_id""").fetchall()
    assert got == [("outer", 0, None), ("a", 1, "outer"), ("other-thread", 0, None), ("b", 1, "outer"),
                   ("same", 0, None), ("same-inner", 1, "same"), ("after-empty", 0, None), ("empty", 1, "after-empty")]


def test_payloads_domains_marks_and_times(tmp_path):
    con = ingested(tmp_path, {
        "itertrace": {"domain": "itertrace", "marks": ["arrive", "tokens"]},
        "baseTimeNanoseconds": 1_000_000_000_000_000_000,
        "traceEvents": [
            span("step", "=1712195495519689.047", 0.001, **{"Concrete Inputs": ["7"], "Input type": ["Scalar"]}),
            span("arrive", 2, 0, **{"Concrete Inputs": ["42"]}),
            span("tokens +1,2 -3", 3, 0, **{"Concrete Inputs": ["7"]}),
            span("mine", 4, 1, domain="other", **{"Concrete Inputs": ["1", "2"]}),
            {"ph": "i", "s": "t", "name": "instant", "pid": 10, "tid": 11, "ts": 5, "args": {"Concrete Inputs": ["9"]}},
        ]}, {
        "baseTimeNanoseconds": 1_000_000_000_000_000_500,  # 500 ns later: its times are moved onto the first's
        "traceEvents": [span("late", 1, 1)]})
    assert con.execute("SELECT text, start_ns, end_ns, int64_value, domain_name, domain_id > 0 FROM nvtx_ranges "
                       "ORDER BY range_id").fetchall() == [
        ("late", 1500, 2500, None, None, False),
        ("mine", 4000, 5000, None, "other", True),
        ("step", 1712195495519689047, 1712195495519689048, 7, "itertrace", True)]
    assert con.execute("SELECT text, ts_ns, int64_value, domain_name FROM nvtx_marks ORDER BY mark_id").fetchall() == [
        ("arrive", 2000, 42, "itertrace"), ("tokens +1,2 -3", 3000, 7, "itertrace"), ("instant", 5000, 9, "itertrace")]
    assert con.execute("SELECT source_no, time_shift_ns FROM kineto_sources ORDER BY 1").fetchall() == [(1, 0), (2, 500)]
    assert con.execute("SELECT DISTINCT session_start_utc_ns FROM capture_meta").fetchall() == [(10**18,)]


def test_gpu_work_belongs_to_the_launching_process(tmp_path):
    con = ingested(tmp_path, {"traceEvents": [
        span("cudaLaunchKernel", 1, 1, cat="cuda_runtime", pid=100, tid=101, correlation=5),
        span("cudaMemcpyAsync", 3, 1, cat="cuda_runtime", pid=200, tid=201, correlation=6),
        span("k", 2, 3, cat="kernel", pid=0, tid=7, correlation=5, device=0, stream=7),
        span("Memcpy HtoD (Pageable -> Device)", 4, 1, cat="gpu_memcpy", pid=1, tid=9, correlation=6, device=1,
             stream=9, bytes=4096),
        span("orphan", 9, 1, cat="kernel", pid=0, tid=7, device=0, stream=7),
    ]})
    assert con.execute("SELECT name, kind, pid, device_id, stream_id, bytes, copy_kind FROM gpu_ops "
                       "ORDER BY gpu_op_id").fetchall() == [
        ("k", "kernel", 100, 0, 7, None, None),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", 200, 1, 9, 4096, "Host-to-Device"),
        ("orphan", "kernel", None, 0, 7, None, None)]  # two processes: none can be assumed


def test_closing_line_counts_every_category_kept_and_skipped(tmp_path, capsys):
    """Every event of the trace is counted once, under its category: where it went, or why it was skipped."""
    from itertrace.cli import main

    trace = write(tmp_path / "t.json", {"traceEvents": [
        span("engine.py(1): step", 0, 50, cat="python_function"), span("model.py(2): run", 1, 9, cat="python_function"),
        span("forward", 2, 5), span("aten::mm", 3, 1, cat="cpu_op"),
        span("cudaLaunchKernel", 4, 1, cat="cuda_runtime", correlation=5),
        span("gemm", 6, 2, cat="kernel", pid=0, tid=7, correlation=5, device=0, stream=7),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 10, "tid": 11, "ts": 4},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 0, "tid": 7, "ts": 6, "bp": "e"},
        span("forward", 6, 2, cat="gpu_user_annotation", pid=0, tid=7),
        span("Stream Sync", 8, 1, cat="cuda_sync", pid=0, tid=7, stream=7),
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": 0, "dur": 60},
        {"ph": "M", "name": "thread_name", "pid": 10, "tid": 11, "args": {"name": "main"}},
        {"ph": "M", "name": "process_sort_index", "pid": 10, "tid": 0, "args": {"sort_index": 1}},
        {"ph": "i", "s": "t", "name": "mark", "pid": 10, "tid": 11, "ts": 9},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 10, "tid": 11, "ts": 9},
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 60},
        {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "pid": 10, "tid": 11, "ts": 3},
        span("something", 9, 1, cat="overhead"),
    ]})
    assert main(["ingest", str(trace), "--db", str(tmp_path / "t.duckdb")]) == 0
    assert capsys.readouterr().err.splitlines()[1] == (
        "itertrace: kept 13 of 18 trace events: ac2g 2 (flows, read for correlation ids), python_function 2 "
        "(frames, in nvtx_ranges), cpu_instant_event 1 (nvtx_marks), cpu_op 1 (kineto_cpu_ops), cuda_runtime 1 "
        "(cuda_api), gpu_user_annotation 1 (kineto_gpu_annotations), i 1 (nvtx_marks), kernel 1 (gpu_ops), "
        "M 1 (names of threads and processes), trace 1 (the profiler's span, in capture_spans), user_annotation 1 "
        "(nvtx_ranges); skipped 5: cuda_sync 1 (synchronization waits, not GPU work), fwdbwd 1 (flows between "
        "ops), i 1 (on no thread: pid or tid not a number), M 1 (display settings), overhead 1 (not read)")
