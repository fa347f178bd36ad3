"""The engine's commands end to end: run logs, summaries, experiments, workloads and bad input."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from itertrace.profiler import workloads as wl
from itertrace.profiler.session import percentile

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_writes_logs_whose_latency_matches_the_summary(tmp_path, capsys):
    out = tmp_path / "r"
    rc, text, _ = _run(capsys, "run", "--workload", "synthetic", "--num-requests", "40", "--rate", "50",
                       "--output-len", "uniform:4:40", "--out", str(out), "--format", "json")
    assert rc == 0
    summary = json.loads(text)
    assert summary["simulated"] is True and summary["completed"] == 40
    meta = json.loads((out / "run.json").read_text())
    assert meta["runner"] == "simulated" and meta["clock_source"] == "simulated"
    assert meta["config"]["scheduler"]["policy"] == "fcfs" and meta["versions"]["duckdb"]
    for name in ("iterations", "events", "requests"):  # each file on its own says who made it
        for kv in (pq.ParquetFile(out / f"{name}.parquet").metadata.metadata,  # the file's, and the table's read
                   pq.read_table(out / f"{name}.parquet").schema.metadata):
            assert (kv[b"itertrace.runner"], kv[b"itertrace.simulated"]) == (b'"simulated"', b"true")
    assert meta["workload"] == "synthetic" and meta["config"]["workload"] == {  # enough to run it again
        "name": "synthetic", "num_requests": 40, "rate": 50.0, "cv": 1.0, "prompt_len": "128", "output_len": "uniform:4:40"}
    # TTFT recomputed from the event log alone agrees with the engine's own summary
    events = pq.read_table(out / "events.parquet").to_pylist()
    arrival = {r["request_id"]: r["arrival_ns"] for r in pq.read_table(out / "requests.parquet").to_pylist()}
    intake = {e["request_id"]: e["ts_ns"] for e in events if e["kind"] == "arrive"}
    assert all(intake[r] >= arrival[r] for r in arrival)
    first = {e["request_id"]: e["ts_ns"] for e in events if e["kind"] == "first_token"}
    ttft = [(first[r] - arrival[r]) / 1e6 for r in first]
    assert percentile(ttft, 50) == pytest.approx(summary["ttft_ms_p50"])
    assert percentile(ttft, 99) == pytest.approx(summary["ttft_ms_p99"])
    iterations = pq.read_table(out / "iterations.parquet")
    assert iterations.num_rows == summary["iterations"] and all(iterations.column("simulated").to_pylist())
    tokens = pq.read_table(out / "requests.parquet").column("output_tokens").to_pylist()
    assert sum(tokens) == summary["output_tokens"] == sum(iterations.column("decode_tokens").to_pylist()) + 40


def test_run_refuses_a_non_empty_out_dir_and_leaves_it_alone(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, _, err = _run(capsys, "run", "--num-requests", "2", "--out", str(out))
    assert rc == 2 and err.count("\n") == 1 and "already exists" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("argv, needle", [
    (["run", "--capacity", "0"], "--capacity: expected an integer of at least 1, not 0"),
    (["run", "--num-requests", "many"], "--num-requests: expected an integer of at least 1, not 'many'"),
    (["ingest", "x", "--db", "y", "--batch-rows", "abc"], "--batch-rows: expected an integer of at least 1, not 'abc'"),
    (["run", "--policy", "lottery"], "--policy"),
    (["run", "--decode-reserve", "1.5"], "--decode-reserve"),
    (["run", "--workload", "nonsense"], "--workload"),
    (["run", "--output-len", "choice:8,16@0.5"], "--output-len 'choice:8,16@0.5': expected"),
    (["run", "--preemption", "swap"], "--swap-blocks"),
    (["experiment", "nope"], "invalid choice"),
    (["run", "--cost", "/nonexistent/cost.json"], "no such cost-model file"),
    (["run", "--cost", "/"], "/: cannot read the cost-model file"),
    (["run", "--rate", "inf"], "rate and cv finite"),
    (["run", "--rate", "5", "--cv", "nan"], "rate and cv finite"),
    (["run", "--prompt-len", "0"], "--prompt-len '0': expected N, uniform:LO:HI or choice"),
    (["run", "--output-len", "choice:8,16@-1,2"], "--output-len 'choice:8,16@-1,2': expected"),
    (["run", "--time-scale", "0"], "--time-scale"),
    (["experiment", "worked-example", "--out", "/dev/null"], "--out /dev/null"),
    (["experiment", "worked-example", "--out", "/dev/null/x"], "--out /dev/null/x: cannot create it"),
    (["experiment", "worked-example", "--num-blocks", "1"], "request 0 ended rejected (too_long)"),
    (["experiment", "fairness", "--token-budget", "20", "--no-chunked-prefill"], "ended rejected (too_long)"),
    (["experiment", "fairness", "--policy", "srw"], "fairness sets --policy itself"),
    (["experiment", "slot-time", "--capacity", "8"], "slot-time sets --capacity itself"),
    (["experiment", "worked-example", "--capacity", "16"], "worked-example sets --capacity itself"),  # the usual default
    (["experiment", "worked-example", "--requests", "40"], "worked-example sets --requests itself"),
    (["run", "--swap-blocks", "-3"], "--swap-blocks: expected an integer of at least 0, not -3"),
    (["experiment", "fairness", "--swap-blocks", "5"], "fairness sets --swap-blocks itself"),
    (["experiment", "slot-time", "--token-budget", "64"], "slot-time needs --token-budget of at least 512"),
    (["experiment", "slot-time", "--requests", "10"], "--requests: expected an integer of at least 20, not 10"),
    (["calibrate", "--out", "/nonexistent/cost.json"], "folder /nonexistent does not exist"),
    (["run", "--limit", "5"], "--limit 5: --workload synthetic does not read it (only trace file workloads do)"),
    (["run", "--workload", "worked-example", "--num-requests", "3"], "--num-requests 3: --workload worked-example "
     "does not read it (only synthetic, slot-time-uniform and slot-time-variable workloads do)"),
    (["run", "--workload", "slot-time-variable", "--output-len", "7"], "--output-len 7: --workload slot-time-variable"),
    (["run", "--num-requets", "10"], "itertrace: error: unrecognized arguments: --num-requets 10\n"),
])
def test_bad_flags_get_one_line_and_status_2(argv, needle, capsys):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("itertrace: error:") and err.count("\n") == 1 and needle in err


def test_torch_runner_flags_it_cannot_use_get_one_line_and_leave_no_run_dir(tmp_path, capsys):
    for argv, needle in [(["--hidden", "100", "--heads", "3"], "--heads 3, --kv-heads 4: hidden_size 100 is not a multiple"),
                         (["--heads", "4", "--kv-heads", "3"], "--kv-heads 3: num_heads 4 is not a multiple"),
                         (["--device", "bogus"], "--device 'bogus': expected cpu or cuda"),
                         (["--device", "meta"], "--device 'meta': expected cpu or cuda")]:
        rc, out, err = _run(capsys, "run", "--runner", "torch", *argv, "--num-requests", "2",
                            "--out", str(tmp_path / "r"))
        assert rc == 2 and out == "" and err.count("\n") == 1 and needle in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, body, needle", [
    ("bad.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,10\n", "missing column(s) GeneratedTokens"),
    ("bad2.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,ten,3\n",
     "bad2.csv:2: bad row: ContextTokens 'ten': expected a whole number of tokens"),
    ("half.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4,3.5\n",
     "half.csv:2: bad row: GeneratedTokens '3.5': expected a whole number of tokens"),
    ("iso.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:17:03.97,4,3\n",
     "iso.csv:2: bad row: TIMESTAMP '2023-11-16T18:17:03.97': expected a time like YYYY-MM-DD HH:MM:SS.fffffff"),
    ("extra.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4,3,7\n",
     "extra.csv:2: bad row: 4 fields, the header has 3"),
    ("cut.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4,3\n2023-11-16 18:17:04.1,4",
     "cut.csv:3: bad row: 2 fields, the header has 3"),
    ("bool.jsonl", '{"timestamp": 1, "input_length": true, "output_length": 4}\n',
     "bool.jsonl:1: input_length True: expected a whole number of tokens"),
    ("list.jsonl", '[1, 3, 4]\n', "list.jsonl:1: a JSON list, not an object"),
    ("open.jsonl", '{"timestamp": 1, "input_length": 3\n', "open.jsonl:1: not JSON"),
    ("bad.jsonl", '{"timestamp": 1, "input_length": 3, "output_length": 4}\n{"timestamp": 2}\n', "bad.jsonl:2:"),
    ("empty.jsonl", "", "no requests"),
    ("neg.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,-4,3\n",
     "neg.csv:2: bad row: ContextTokens '-4': a length cannot be negative"),
    ("short.csv", "ContextTokens,GeneratedTokens,TIMESTAMP\n4,3\n", "short.csv:2: bad row"),
    ("neg.jsonl", '{"timestamp": 1, "input_length": 3, "output_length": -4}\n', "neg.jsonl:1:"),
    ("frac.jsonl", '{"timestamp": 1, "input_length": 3.7, "output_length": 4}\n', "not a whole number"),
    ("inf.jsonl", '{"timestamp": Infinity, "input_length": 3, "output_length": 4}\n', "inf.jsonl:1:"),
    ("binary.jsonl", "\udcff\udcfe garbage\n", "binary.jsonl: not a text file"),
    ("huge.jsonl", '{"timestamp": 1e300, "input_length": 3, "output_length": 4}\n', "huge.jsonl:1:"),
    ("far.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n9999-11-16 18:17:03.97,4,3\n",
     "far.csv:2: bad row: TIMESTAMP '9999-11-16 18:17:03.97': out of the range"),
    ("bom.csv", "\ufeffTIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,4\n", "missing column(s) GeneratedTokens\n"),
])
def test_malformed_workload_files_get_one_line(tmp_path, capsys, name, body, needle):
    path = tmp_path / name
    path.write_bytes(body.encode("utf-8", "surrogateescape"))
    rc, _, err = _run(capsys, "run", "--workload", str(path), "--out", str(tmp_path / "r"))
    assert rc == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_zero_lengths_run_as_one_token_and_say_so(tmp_path, capsys):
    path = tmp_path / "zeros.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4,0\n"
                    "2023-11-16 18:17:04.97,0,3\n2023-11-16 18:17:05.97,5,2\n")
    specs = wl.load_trace(path)
    assert [(s.prompt_tokens, s.output_tokens) for s in specs] == [(4, 1), (1, 3), (5, 2)]
    assert capsys.readouterr().err == f"itertrace: note: {path}: 2 request(s) with 0 prompt or output tokens run with 1\n"


def test_traces_with_a_byte_order_mark_load(tmp_path):
    csv = tmp_path / "bom.csv"
    csv.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4,3\n")
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"timestamp": 5, "input_length": 4, "output_length": 3}\n')
    for path in (csv, jsonl):
        assert [(s.arrival_ns, s.prompt_tokens, s.output_tokens) for s in wl.load_trace(path)] == [(0, 4, 3)]


def test_a_trace_whose_arrivals_outrun_the_clock_gets_one_line(tmp_path, capsys):
    path = tmp_path / "spread.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 3, "output_length": 4}\n'
                    '{"timestamp": 4e12, "input_length": 3, "output_length": 4}\n')  # 127 years apart
    rc, _, err = _run(capsys, "run", "--workload", str(path), "--time-scale", "0.5", "--out", str(tmp_path / "r"))
    assert rc == 2 and "arrivals span 254 years after --time-scale 0.5" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_jsonl_and_csv_traces_load_lengths_and_relative_arrivals(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1000.5, "input_length": 12, "output_length": 3}\n'
                    '{"timestamp": 1250, "input_length": 7, "output_length": 9}\n')
    specs = wl.load_trace(path)
    assert [(s.arrival_ns, s.prompt_tokens, s.output_tokens) for s in specs] == [(0, 12, 3), (249_500_000, 7, 9)]
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
                   "2023-11-16 18:17:04.0319600,3180,8\n")
    specs = wl.load_trace(csv, time_scale=2.0)
    assert [(s.arrival_ns, s.prompt_tokens, s.output_tokens) for s in specs] == [(0, 4808, 10), (26_000_000, 3180, 8)]


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="../shared/traces is absent")
def test_azure_trace_runs_on_the_simulated_runner(tmp_path, capsys):
    trace = SHARED / "traces" / "AzureLLMInferenceTrace_conv.csv"
    specs = wl.load_trace(trace, limit=300)
    assert len(specs) == 300 and specs[0].arrival_ns == 0 and specs[0].prompt_tokens == 374
    rc, text, _ = _run(capsys, "run", "--workload", str(trace), "--limit", "300", "--capacity", "32",
                       "--out", str(tmp_path / "r"), "--format", "json")
    summary = json.loads(text)
    assert rc == 0 and summary["completed"] == 300
    assert summary["output_tokens"] == sum(s.output_tokens for s in specs)


def test_experiments_print_tables_and_json(capsys):
    rc, text, _ = _run(capsys, "experiment", "worked-example", "--format", "json")
    rows = {r["mode"]: r for r in json.loads(text)["rows"]}
    assert rc == 0 and rows["static"]["iterations_finished_ids_held"] == 480
    assert rows["continuous"]["waiting_first_start"] == 32 and rows["static"]["waiting_first_start"] == 512
    rc, text, err = _run(capsys, "experiment", "worked-example")
    assert err == ""  # a simulated experiment takes seconds: no stage lines (torch ones print them)
    assert rc == 0 and "SIMULATED" in text and "batch at iteration 32: [7, 8, 9, 10, 11, 12, 13, 14]" in text


def test_a_failed_experiment_leaves_nothing_under_out_and_a_finished_one_all_of_it(tmp_path, capsys):
    """Experiments write into a temporary folder beside --out, renamed to it once every run is done."""
    rc, _, err = _run(capsys, "experiment", "worked-example", "--num-blocks", "1", "--out", str(tmp_path / "e"))
    assert rc == 2 and err.count("\n") == 1 and list(tmp_path.iterdir()) == []  # its static run had finished
    rc, _, _ = _run(capsys, "experiment", "worked-example", "--out", str(tmp_path / "e"))
    assert rc == 0 and [p.name for p in tmp_path.iterdir()] == ["e"]
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["worked-example-continuous", "worked-example-static"]
    assert (tmp_path / "e" / "worked-example-static" / "run.json").is_file()


def test_a_run_stopped_by_sigterm_says_so_and_leaves_nothing(tmp_path):
    """SIGTERM (kill, a job's time limit) cleans up as Ctrl-C does: exit 143, one line, no directory."""
    proc = subprocess.Popen([sys.executable, "-m", "itertrace.cli", "run", "--num-requests", "200000",
                             "--out", str(tmp_path / "r")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(tmp_path.glob(".r.*/*.partial")):  # the run has started writing its logs
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and out == ""
    assert err.splitlines()[-1] == "itertrace: terminated"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("r2, warned", [(0.37, True), (0.93, False)])
def test_calibrate_warns_of_a_poor_fit_and_still_writes_it(tmp_path, capsys, monkeypatch, r2, warned):
    from itertrace.profiler.runners import calibrate
    from itertrace.profiler.runners.sim_runner import CostModel

    stats = {"iterations": 40, "r2": r2, "median_abs_error_pct": 30.1}
    monkeypatch.setattr(calibrate, "calibrate", lambda spec: (CostModel(), stats))
    out = tmp_path / "cost.json"
    rc, text, err = _run(capsys, "calibrate", "--out", str(out))
    assert rc == 0 and out.is_file() and f"(R^2 {r2:.3f}, 40 iterations); wrote {out}" in text
    assert err.startswith("itertrace: warning: a poor fit (R^2 0.37, median error 30%)") == warned
    assert err.count("\n") == warned


def test_calibrate_replaces_only_a_cost_model_it_wrote(tmp_path, capsys, monkeypatch):
    """--out refuses a file calibrate did not write (a settings file, a run's JSON), before the minutes
    calibrating takes, and leaves it as it was; a cost model written before is replaced."""
    from itertrace.profiler.runners import calibrate
    from itertrace.profiler.runners.sim_runner import CostModel

    calls = []
    monkeypatch.setattr(calibrate, "calibrate", lambda spec: calls.append(spec) or (CostModel(), {
        "iterations": 40, "r2": 0.95, "median_abs_error_pct": 3.0}))
    theirs = {"settings.json": '{"theme": "dark"}\n', "run.json": '{"config": {"cost_model": {}}}\n',
              "notes.txt": "my notes\n"}
    for name, text in theirs.items():
        (tmp_path / name).write_text(text)
        rc, _, err = _run(capsys, "calibrate", "--out", str(tmp_path / name))
        assert rc == 2 and err.count("\n") == 1 and "holds something other than a cost model" in err, err
    assert calls == [] and {name: (tmp_path / name).read_text() for name in theirs} == theirs
    mine = tmp_path / "cost.json"
    for _ in range(2):
        rc, _, _ = _run(capsys, "calibrate", "--out", str(mine))
        assert rc == 0 and calibrate.load(mine) == CostModel()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*theirs, "cost.json"])


def test_an_out_path_under_a_file_is_named_as_a_file_by_every_command(tmp_path, capsys):
    """Each command that writes a file says a path's folder is a file, not that it "does not exist"."""
    from tests.conftest import SAMPLES

    db = tmp_path / "run.duckdb"
    assert main(["ingest", str(SAMPLES / "worked-example-static" / "run"), "--db", str(db), "--quiet"]) == 0
    (tmp_path / "afile").write_text("mine")
    for argv in (["ingest", str(SAMPLES / "worked-example-static" / "run"), "--db", "{f}/x.duckdb"],
                 ["query", "membership_slot_time", "--db", str(db), "--out", "{f}/x.csv"],
                 ["report", "--db", str(db), "-o", "{f}/sub/r.html"],
                 ["calibrate", "--out", "{f}/cost.json"]):
        capsys.readouterr()
        rc, _, err = _run(capsys, *(a.format(f=tmp_path / "afile") for a in argv))
        assert rc == 2 and err.endswith(f"{tmp_path / 'afile'} is a file, not a folder\n") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "run.duckdb"]
