"""Values past what the machine or the file formats hold: one line and status 2, before anything is allocated
or written, instead of OverflowError, RecursionError, ConversionException, OutOfMemoryException or a KV
cache that grows until the kernel kills the process."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import duckdb
import pytest

from itertrace.cli import main

HUGE = ("1" + "0" * 30, str(2**63), str(2**31))


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: "), captured.err
    return lines[0]


def nothing_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("flag", ["--prompt-len", "--output-len"])
def test_a_length_past_what_the_engine_runs_is_refused(flag, value, tmp_path, capsys):
    for text in (value, f"uniform:1:{value}", f"choice:1,{value}@0.5,0.5"):
        line = refused(capsys, "run", "--workload", "synthetic", "--num-requests", "2", flag, text,
                       "--out", str(tmp_path / "run"))
        assert f"{flag} {text!r}" in line and "at most 2147483647" in line, line
    nothing_left(tmp_path)


@pytest.mark.parametrize("value", [*HUGE, "1e300"])
def test_a_trace_length_past_what_the_engine_runs_is_refused(value, tmp_path, capsys):
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_text(json.dumps({"timestamp": 0, "input_length": 3, "output_length": 1}) + "\n"
                     + f'{{"timestamp": 1, "input_length": {value}, "output_length": 3}}\n')
    line = refused(capsys, "run", "--workload", str(jsonl), "--out", str(tmp_path / "run"))
    assert f"{jsonl}:2: input_length" in line and "at most 2147483647" in line, line
    csv = tmp_path / "trace.csv"
    csv.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,{value},3\n")
    line = refused(capsys, "run", "--workload", str(csv), "--out", str(tmp_path / "run"))
    assert f"{csv}:2: bad row: ContextTokens" in line, line
    nothing_left(tmp_path)


def test_a_json_line_nested_too_deep_is_refused(tmp_path, capsys):
    jsonl = tmp_path / "deep.jsonl"
    jsonl.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    line = refused(capsys, "run", "--workload", str(jsonl), "--out", str(tmp_path / "run"))
    assert f"{jsonl}:1: nested too deeply" in line, line


def test_a_kv_cache_the_machine_cannot_hold_is_refused_before_it_is_allocated(tmp_path, capsys):
    for runner in ("simulated", "torch"):
        line = refused(capsys, "run", "--runner", runner, "--num-blocks", "1000000000000", "--workload",
                       "worked-example", "--out", str(tmp_path / "run"))
        assert "--num-blocks 1000000000000" in line and "this machine has" in line, line
    line = refused(capsys, "run", "--runner", "torch", "--swap-blocks", "1000000000000", "--preemption", "swap",
                   "--workload", "worked-example", "--out", str(tmp_path / "run"))
    assert "--swap-blocks 1000000000000" in line, line
    nothing_left(tmp_path)


@pytest.mark.parametrize("limit", ["1KB", "20MB", "63MiB"])
def test_a_memory_limit_below_what_an_ingest_needs_is_refused(limit, tmp_path, capsys):
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--out", str(run)]) == 0
    line = refused(capsys, "ingest", str(run), "--db", str(tmp_path / "t.duckdb"), "--memory-limit", limit)
    assert f"--memory-limit {limit}: below the 64 MiB" in line, line
    assert main(["ingest", str(run), "--db", str(tmp_path / "t.duckdb"), "--memory-limit", "64MiB", "--quiet"]) == 0


def test_a_memory_limit_that_is_not_a_size_names_the_flag_alone(tmp_path, capsys):
    """The line names --memory-limit and its value, not the storage settings the ingest adds for itself."""
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--out", str(run)]) == 0
    line = refused(capsys, "ingest", str(run), "--db", str(tmp_path / "t.duckdb"), "--memory-limit", "lots")
    assert line.startswith("itertrace: error: --memory-limit lots: not a size"), line
    assert "block_size" not in line and "storage_compatibility" not in line, line
    nothing_left(tmp_path)
    assert not (tmp_path / "t.duckdb").exists()


def test_running_out_of_memory_under_a_limit_says_which_limit(tmp_path, capsys, monkeypatch):
    from itertrace.ingest.loader import LoadContext

    def out_of_memory(self, schema, table, name=None):
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block of size 256.0 KiB")

    monkeypatch.setattr(LoadContext, "write_table", out_of_memory)
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--out", str(run)]) == 0
    line = refused(capsys, "ingest", str(run), "--db", str(tmp_path / "t.duckdb"), "--memory-limit", "100MB")
    assert "DuckDB ran out of memory under --memory-limit 100MB" in line and "failed to pin block" in line, line
    nothing_left(tmp_path)


@pytest.mark.parametrize("key, value", [("seed", 10**30), ("clock_epoch_unix_ns", -(2**63) - 1)])
def test_a_run_json_integer_past_64_bits_is_refused(key, value, tmp_path, capsys):
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--out", str(run)]) == 0
    meta = json.loads((run / "run.json").read_text())
    meta[key] = value
    (run / "run.json").write_text(json.dumps(meta))
    line = refused(capsys, "ingest", str(run), "--db", str(tmp_path / "t.duckdb"))
    assert f"run.json: {key} {value} does not fit a 64-bit integer" in line, line


def test_a_report_on_a_table_of_the_wrong_types_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--out", str(run)]) == 0
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(run), "--db", str(db), "--quiet"]) == 0
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE nvtx_ranges AS SELECT 'x' AS start_ns, 'y' AS end_ns, 'step' AS text")
    line = refused(capsys, "report", "--db", str(db), "-o", str(tmp_path / "r.html"))
    assert str(db) in line and "nvtx_ranges" in line, line
    assert not (tmp_path / "r.html").exists()
    line = refused(capsys, "sql", "SELECT count(*) FROM iterations", "--db", str(db))
    assert line.startswith(f"itertrace: error: {db}: nvtx_ranges is not as `itertrace ingest` makes it: "), line


@pytest.mark.parametrize("rate", ["1e-300", "1e-10"])
def test_a_rate_whose_arrivals_outrun_the_engine_clock_is_refused(rate, tmp_path, capsys):
    line = refused(capsys, "run", "--workload", "synthetic", "--num-requests", "4", "--rate", rate,
                   "--out", str(tmp_path / "run"))
    assert line.startswith(f"itertrace: error: --rate {rate}: 4 requests arriving at {rate} per second reach "
                           "past the engine's clock (146 years); give at least 6.5e-10 per second, or 0 for all at "
                           "once"), line
    assert not (tmp_path / "run").exists()
    nothing_left(tmp_path)


@pytest.mark.parametrize("cv", ["1e-300", "1e300", "1e-160"])
def test_a_cv_the_gamma_draw_cannot_take_is_refused(cv, tmp_path, capsys):
    for rate in ("0", "2"):
        line = refused(capsys, "run", "--workload", "synthetic", "--num-requests", "4", "--rate", rate, "--cv", cv,
                       "--out", str(tmp_path / "run"))
        assert line == (f"itertrace: error: --cv {float(cv):g}: the gamma shape 1/cv^2 is not a positive finite "
                        "number; give a cv from 1e-150 to 1e150"), line
    nothing_left(tmp_path)


def test_an_output_no_kv_pool_holds_is_refused_with_the_longest_that_fits(tmp_path, capsys):
    line = refused(capsys, "run", "--workload", "synthetic", "--output-len", "1000000000", "--num-requests", "1",
                   "--out", str(tmp_path / "run"))
    assert line == ("itertrace: error: --output-len 1000000000: its one request can never run: the KV pool "
                    "holds 65,536 tokens (--num-blocks 4,096 x --block-size 16) and the shortest needs 1,000,000,128 "
                    "(prompt + output); at most 65,408 output tokens fit beside a 128-token prompt"), line
    line = refused(capsys, "run", "--workload", "synthetic", "--prompt-len", "70000", "--output-len", "1",
                   "--num-blocks", "4096", "--out", str(tmp_path / "run"))
    assert line.startswith("itertrace: error: --prompt-len 70000: none of the 64 requests can ever run: "), line
    line = refused(capsys, "run", "--workload", "synthetic", "--prompt-len", "600", "--no-chunked-prefill",
                   "--token-budget", "512", "--decode-reserve", "0", "--out", str(tmp_path / "run"))
    assert line == ("itertrace: error: --prompt-len 600: none of the 64 requests can ever run: with "
                    "--no-chunked-prefill a prompt must fit one iteration's prefill room of 512 tokens "
                    "(--token-budget less --decode-reserve), and the shortest has 600"), line
    assert not (tmp_path / "run").exists()
    nothing_left(tmp_path)


def test_requests_no_kv_pool_holds_are_counted_in_a_note(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", "--workload", "synthetic", "--output-len", "choice:16,100000@0.5,0.5", "--num-requests", "8",
                 "--out", str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    rejected = json.loads((run / "run.json").read_text())["summary"]["states"]["rejected"]
    assert 0 < rejected < 8
    assert err == [f"itertrace: note: {rejected} of 8 requests are rejected on arrival: their prompt and output need "
                   "more than the KV pool's 65,536 tokens (--num-blocks 4,096 x --block-size 16)"]


@pytest.mark.parametrize("argv", [
    ["run", "--workload", "synthetic", "--num-requests", "1000000000"],
    ["run", "--workload", "slot-time-uniform", "--num-requests", "1000000000"],
    ["experiment", "slot-time", "--requests", "1000000000"],
])
def test_more_requests_than_memory_holds_are_refused_before_any_is_made(argv, tmp_path, capsys):
    line = refused(capsys, *argv, "--out", str(tmp_path / "run"))
    flag = argv[-2]
    assert line.startswith(f"itertrace: error: {flag} 1000000000: the requests alone take at least 940.0 GB of "
                           "memory (940 bytes each, before the run starts), and this machine has "), line
    assert not (tmp_path / "run").exists()
    nothing_left(tmp_path)
