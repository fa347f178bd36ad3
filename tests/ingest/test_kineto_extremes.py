"""PyTorch profiler traces with numbers at the ends of their types: a trace whose clock cannot be trusted is
refused with one line naming the file (status 2, nothing written); events that cannot be placed (no ts or
dur, a negative dur, a pid or tid that is no integer) are left out, and a note counts them by category."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from itertrace.cli import main
from test_ingest_formats import export_tables, write_parquetdir
from test_input_extremes import refused, rows

EVENT = {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 7, "tid": 8, "ts": 10, "dur": 5}
KERNEL = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12, "dur": 2,
          "args": {"device": 0, "stream": 7, "correlation": 1}}


def notes(capsys, *sources: Path, db: Path) -> list[str]:
    """The note lines of an ingest that must succeed."""
    assert main(["ingest", *map(str, sources), "--db", str(db), "--quiet"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert all(line.startswith("itertrace: note: ") for line in lines), captured.err
    return lines


def trace(path: Path, events: list[dict], **top) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


@pytest.mark.parametrize("base", [2**80, -(2**63), 2**62, -1, "1712195495519689047", 1.5e18, True])
def test_a_base_time_that_is_no_unix_time_in_ns_is_refused(base, tmp_path, target, capsys):
    good = trace(tmp_path / "rank0.json", [EVENT], baseTimeNanoseconds=1_700_000_000_000_000_000)
    bad = trace(tmp_path / "rank1.json", [EVENT], baseTimeNanoseconds=base)
    line = refused(capsys, good, bad, db=target)
    assert line == (f"itertrace: error: {bad}: baseTimeNanoseconds {json.dumps(base)} is not a Unix time in ns "
                    "that itertrace stores (an integer from 0 to 2^62 - 1)")


@pytest.mark.parametrize("ts", [9.3e15, -9.3e15, 4611686018427388])
def test_a_timestamp_past_what_a_64_bit_difference_holds_is_refused(ts, tmp_path, target, capsys):
    bad = trace(tmp_path / "t.json", [EVENT, {**EVENT, "ts": ts}])
    line = refused(capsys, bad, db=target)
    assert line.startswith(f"itertrace: error: {bad}: ") and "past ±2^62 ns (146 years)" in line, line


def test_an_end_past_the_range_is_refused(tmp_path, target, capsys):
    bad = trace(tmp_path / "t.json", [EVENT, {**EVENT, "ts": 4e15, "dur": 1e15}])
    line = refused(capsys, bad, db=target)
    assert line == (f"itertrace: error: {bad}: times reach 5000000000000000000 ns, past ±2^62 ns (146 years), "
                    "the range of times itertrace stores")


def test_ranks_whose_base_times_put_times_past_the_range_are_refused(tmp_path, target, capsys):
    early = trace(tmp_path / "rank0.json", [EVENT], baseTimeNanoseconds=1)
    late = trace(tmp_path / "rank1.json", [{**EVENT, "ts": 4e15}], baseTimeNanoseconds=2**62 - 2)
    line = refused(capsys, early, late, db=target)
    assert line.startswith(f"itertrace: error: {late}: times reach ") and "once counted from the earliest" in line


@pytest.mark.parametrize("pid", ["7", 7.0, 7])
def test_a_pid_that_reads_as_the_same_integer_is_that_process(pid, tmp_path, capsys):
    src = trace(tmp_path / "t.json", [{**EVENT, "pid": pid}, {**EVENT, "pid": pid, "tid": "8", "ts": 20}])
    db = tmp_path / "t.duckdb"
    assert notes(capsys, src, db=db) == []
    assert rows(db, "SELECT pid, tid, start_ns FROM nvtx_ranges ORDER BY start_ns") == [(7, 8, 10_000), (7, 8, 20_000)]


@pytest.mark.parametrize("bad, shown", [
    (2**70, "pid 1180591620717411303424"), (7.5, "pid 7.5"), ("seven", 'pid "seven"'), (True, "pid true"),
    (None, "no pid"), ("", 'pid ""'),
])
def test_events_whose_pid_is_no_integer_are_left_out_with_a_note(bad, shown, tmp_path, capsys):
    events = [EVENT, {**EVENT, "pid": bad, "ts": 20}, {**EVENT, "pid": bad, "ts": 30, "ph": "i"},
              {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 40},  # no thread's
              {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 1,
               "dur": 50}]
    if bad is None:
        events[1].pop("pid")
    src = trace(tmp_path / "t.json", events)
    db = tmp_path / "t.duckdb"
    assert notes(capsys, src, db=db) == [
        f"itertrace: note: {src}: 2 events whose pid or tid is not an integer left out (1 instant, 1 user_annotation; "
        f"the first: {shown})"]
    assert rows(db, "SELECT pid, start_ns FROM nvtx_ranges") == [(7, 10_000)]
    assert rows(db, "SELECT count(*) FROM nvtx_marks") == [(0,)]


def test_a_tid_that_is_no_integer_is_left_out_with_a_note(tmp_path, capsys):
    src = trace(tmp_path / "t.json", [EVENT, {**EVENT, "tid": 2**64, "ts": 20}])
    db = tmp_path / "t.duckdb"
    assert notes(capsys, src, db=db) == [
        f"itertrace: note: {src}: 1 event whose pid or tid is not an integer left out (1 user_annotation; "
        "the first: tid 18446744073709551616)"]


def test_an_id_in_args_that_is_no_integer_links_nothing(tmp_path, capsys):
    call = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 8, "ts": 11, "dur": 1}
    src = trace(tmp_path / "t.json", [EVENT, {**call, "args": {"correlation": 2}}, {**call, "ts": 13, "args": {
        "correlation": True}}, {**KERNEL, "args": {"device": 0, "stream": 7.5, "correlation": 1.5}}])
    db = tmp_path / "t.duckdb"
    said = notes(capsys, src, db=db)
    assert rows(db, "SELECT correlation_id FROM cuda_api ORDER BY start_ns") == [(2,), (None,)]
    assert rows(db, "SELECT correlation_id, stream_id FROM gpu_ops") == [(None, 7)]  # the stream: its tid
    assert said == []


def test_events_without_ts_or_dur_are_left_out_with_a_note(tmp_path, capsys):
    no_ts = {k: v for k, v in KERNEL.items() if k != "ts"}
    no_dur = {k: v for k, v in KERNEL.items() if k != "dur"}
    src = trace(tmp_path / "t.json", [EVENT, KERNEL, no_ts, no_dur, {**EVENT, "ts": None},
                                      {**EVENT, "ph": "i", "dur": None}])
    db = tmp_path / "t.duckdb"
    assert notes(capsys, src, db=db) == [
        f"itertrace: note: {src}: 3 events without ts or dur left out (2 kernel, 1 user_annotation)"]
    assert rows(db, "SELECT start_ns, end_ns FROM gpu_ops") == [(12_000, 14_000)]
    assert rows(db, "SELECT start_ns, end_ns FROM nvtx_ranges") == [(10_000, 15_000)]
    assert rows(db, "SELECT count(*) FROM nvtx_marks") == [(1,)]  # an instant has no dur


def test_events_of_negative_length_are_left_out_with_a_note(tmp_path, capsys):
    src = trace(tmp_path / "t.json", [EVENT, KERNEL, {**KERNEL, "dur": -2, "ts": 30}, {**EVENT, "dur": -0.001},
                                      {**EVENT, "dur": 0, "ts": 40}])
    db = tmp_path / "t.duckdb"
    assert notes(capsys, src, db=db) == [
        f"itertrace: note: {src}: 2 events with a negative dur left out (1 kernel, 1 user_annotation)"]
    assert rows(db, "SELECT min(dur_ns), count(*) FROM gpu_ops") == [(2_000, 1)]
    assert rows(db, "SELECT dur_ns FROM nvtx_ranges ORDER BY start_ns") == [(5_000,), (0,)]


def test_a_plain_trace_gets_no_note_about_nsys_tables(tmp_path, capsys):
    src = trace(tmp_path / "t.json", [EVENT])
    db = tmp_path / "t.duckdb"
    assert notes(capsys, src, db=db) == []
    assert rows(db, "SELECT pid, tid, name FROM threads") == [(7, 8, None)]


def test_an_nsys_capture_without_thread_names_still_says_so(tmp_path, capsys):
    tables = export_tables()
    del tables["ThreadNames"]
    db = tmp_path / "t.duckdb"
    assert notes(capsys, write_parquetdir(tables, tmp_path / "export"), db=db) == [
        "itertrace: note: the export holds no ThreadNames table: its 1 thread has no name"]


def test_the_sample_traces_get_no_note(tmp_path, capsys):
    samples = Path(__file__).resolve().parents[2].parent / "shared" / "kineto_samples"
    if not (samples / "alexnet_sync.json.gz").exists():
        pytest.skip(f"Kineto samples not at {samples}")
    for name in ("alexnet_sync", "cpu_only_rank34", "tiny_inference_rank1"):
        assert notes(capsys, samples / f"{name}.json.gz", db=tmp_path / f"{name}.duckdb") == []


def test_the_closing_counts_hold_the_events_left_out(tmp_path):
    """The closing line's counts by category hold every event of the file: those left out with a note too."""
    from itertrace.ingest import ingest

    no_ts = {k: v for k, v in KERNEL.items() if k != "ts"}
    src = trace(tmp_path / "t.json", [EVENT, KERNEL, no_ts, {**KERNEL, "dur": -2, "ts": 30}])
    result = ingest([src], tmp_path / "t.duckdb")
    kernels = sorted((c.events, c.kept_in or "", c.skipped_why or "") for c in result.event_counts
                     if c.category == "kernel")
    assert kernels == [(1, "", "events with a negative dur"), (1, "", "events without ts or dur"), (1, "gpu_ops", "")]
    assert sum(c.events for c in result.event_counts) == 4
