"""Bad PyTorch profiler traces: one line naming the file and the problem, status 2, nothing left behind."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest

from itertrace.cli import main

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "kineto_samples"
EVENT = {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 1, "dur": 2}


def fails(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: "), captured.err
    return lines[0]


def trace_bytes() -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": [EVENT] * 50, "traceName": "t"}, indent=1).encode()


def test_truncated_gzip(tmp_path, target, capsys):
    whole = gzip.compress(trace_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    line = fails(capsys, "ingest", str(cut), "--db", str(target))
    assert str(cut) in line and "truncated or corrupt gzip" in line


@pytest.mark.parametrize("where, expected", [
    (0.5, "the file ends inside the traceEvents array"),
    (0.999, "not valid JSON around the traceEvents array"),
])
def test_truncated_json(tmp_path, target, capsys, where, expected):
    whole = trace_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: int(len(whole) * where)])
    line = fails(capsys, "ingest", str(cut), "--db", str(target))
    assert str(cut) in line and expected in line


@pytest.mark.parametrize("text, expected", [
    ('{"format": "itertrace-run/1", "runner": "torch"}', "no traceEvents array (top-level keys: format, runner)"),
    ("[1, 2, 3]", "not a readable trace"),
    ('[{"name": "no ph"}]', "no trace events"),
    ('{"traceEvents": []}', "no trace events"),
    ('{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "not a readable trace"),
    ('"a string"', "not a JSON object or array"),
    ("hello", "not a JSON object or array"),
    ("", "empty file"),
    ("  \n", "holds only white space"),
])
def test_json_that_is_not_a_trace(tmp_path, target, capsys, text, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    line = fails(capsys, "ingest", str(bad), "--db", str(target))
    assert str(bad) in line and expected in line
    assert "events.json" not in line  # the ingest's own scratch file is not the user's problem


def test_a_bad_second_file_leaves_nothing(tmp_path, target, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_bytes(trace_bytes())
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1}, ')
    assert "bad.json" in fails(capsys, "ingest", str(good), str(bad), "--db", str(target))
    assert "given twice" in fails(capsys, "ingest", str(good), str(good), "--db", str(target))


@pytest.mark.skipif(not (SAMPLES / "cpu_only_rank34.json.gz").exists(), reason=f"Kineto samples not at {SAMPLES}")
def test_trace_without_gpu_events_ingests_its_ranges(tmp_path, capsys):
    db = tmp_path / "cpu.duckdb"
    assert main(["ingest", str(SAMPLES / "cpu_only_rank34.json.gz"), "--db", str(db), "--quiet"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT (SELECT count(*) FROM gpu_ops), (SELECT count(*) FROM cuda_api), "
                           "(SELECT count(*) FROM nvtx_ranges)").fetchall() == [(0, 0, 11)]


def test_nsys_capture_and_kineto_trace_in_one_database(tmp_path, target, capsys):
    from test_ingest_bad_input import small_export

    trace = tmp_path / "t.json"
    trace.write_bytes(trace_bytes())
    export = small_export(tmp_path / "capture.arrow")
    for order in ((trace, export), (export, trace)):
        line = fails(capsys, "ingest", *map(str, order), "--db", str(target))
        assert "nsys captures or PyTorch profiler traces, not both" in line


@pytest.mark.parametrize("where", ["before", "between keys", "inside the array", "after"])
def test_valid_json_padded_with_white_space_is_valid_at_any_size(where, tmp_path, capsys):
    """Past the 64 MB kept of the keys around the array and DuckDB's largest JSON value, in a small .json.gz."""
    pad = b" \n\t\r" * (25 << 20)  # 100 MB
    events = json.dumps([EVENT] * 3).encode()
    body = {"before": pad + b'{"schemaVersion": 1, "traceEvents": ' + events + b"}",
            "between keys": b'{"schemaVersion": 1,' + pad + b'"traceEvents": ' + events + b',' + pad + b'"a": 2}',
            "inside the array": b'{"traceEvents": [' + events[1:-1] + pad + b"," + pad + json.dumps(EVENT).encode()
                                + pad + b"]}",
            "after": b'{"schemaVersion": 1, "traceEvents": ' + events + b"}" + pad}[where]
    padded = tmp_path / "padded.json.gz"
    padded.write_bytes(gzip.compress(body, compresslevel=1))
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(padded), "--db", str(db), "--quiet"]) == 0, capsys.readouterr().err
    with duckdb.connect(str(db), read_only=True) as con:
        ranges = con.execute("SELECT count(*) FROM nvtx_ranges").fetchall()[0][0]
    assert ranges == (4 if where == "inside the array" else 3)


def test_white_space_inside_strings_is_kept(tmp_path, capsys):
    name = "step" + " " * (1 << 20) + "\n  \\\"end\" "  # spaces, an escaped newline, quote and backslash
    pad = b" " * (70 << 20)
    src = tmp_path / "t.json"
    src.write_bytes(b'{"note": "a  \\"  b",' + pad + b'"traceEvents": [' + json.dumps({**EVENT, "name": name}).encode()
                    + pad + b"]}" + pad)
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(src), "--db", str(db), "--quiet"]) == 0, capsys.readouterr().err
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT text FROM nvtx_ranges").fetchall() == [(name,)]
        assert con.execute("SELECT metadata ->> 'note' FROM kineto_sources").fetchall() == [('a  "  b',)]
