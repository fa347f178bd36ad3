"""`itertrace run --torch-profile DIR` live on the CPU: its trace ingests and the itertrace preset reads it."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import duckdb
import pytest
from profiled_run import RUN_ARGS, profiled_run

from itertrace.cli import main
from itertrace.ingest import ingest
from itertrace.queries import QueryDB


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """(run directory, trace, database of both)."""
    made = profiled_run(tmp_path_factory)
    db = tmp_path_factory.mktemp("torch-profile") / "trace.duckdb"
    result = ingest([made.run_dir, made.trace], db)
    assert result.notes == ()  # the trace and the log look like one run
    return made.run_dir, made.trace, db


def test_trace_holds_the_engine_names(traced):
    _, trace, _ = traced
    document = json.loads(gzip.decompress(trace.read_bytes()))
    names = {e["name"] for e in document["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"step", "schedule", "prepare", "forward", "sample", "detokenize", "postprocess", "arrive", "admit",
            "finish"} <= names
    assert document["itertrace"] == {"domain": "itertrace", "marks": ["arrive", "admit", "finish", "tokens"]}


def test_step_ranges_number_the_logged_iterations(traced):
    _, _, db = traced
    with duckdb.connect(str(db), read_only=True) as con:
        steps = con.execute("SELECT int64_value FROM nvtx_ranges WHERE text = 'step' AND domain_name = 'itertrace' "
                            "ORDER BY start_ns").fetchall()
        assert steps == con.execute("SELECT iteration FROM run_iterations ORDER BY iteration").fetchall()
        phases = con.execute("SELECT p.text, count(*) FROM nvtx_ranges AS p JOIN nvtx_ranges AS s "
                             "ON s.range_id = p.parent_range_id WHERE s.text = 'step' GROUP BY 1").fetchall()
        assert {name for name, n in phases if n == len(steps)} >= {"schedule"}  # every step schedules
        marks = con.execute("SELECT text, count(*), count(DISTINCT int64_value) FROM nvtx_marks "
                            "WHERE text IN ('arrive', 'admit', 'finish') GROUP BY 1 ORDER BY 1").fetchall()
        assert marks == [("admit", 6, 6), ("arrive", 6, 6), ("finish", 6, 6)]


def test_frames_are_recorded_and_nest_with_the_engine_ranges(traced):
    """As vLLM's profiler does, the run records Python frames: each step range holds one `Engine.iteration`
    frame, which holds the phases the iteration runs; the step's `schedule` comes before it."""
    _, trace, db = traced
    document = json.loads(gzip.decompress(trace.read_bytes()))
    frames = sum(1 for e in document["traceEvents"] if e.get("cat") == "python_function")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM nvtx_ranges WHERE range_kind = 'python_frame' AND domain_id = -1 "
                           "AND domain_name IS NULL").fetchall() == [(frames,)]
        steps = con.execute("SELECT count(*) FROM nvtx_ranges WHERE text = 'step'").fetchall()[0][0]
        iterations = con.execute("""
            SELECT s.int64_value, f.range_id FROM nvtx_ranges AS s JOIN nvtx_ranges AS f ON f.parent_range_id = s.range_id
            WHERE s.text = 'step' AND f.range_kind = 'python_frame'
              AND regexp_matches(f.text, 'profiler/engine\\.py\\(\\d+\\): iteration$')""").fetchall()
        assert len(iterations) == steps == len({i for i, _ in iterations}) > 3
        inside = con.execute("""
            SELECT p.text FROM nvtx_ranges AS p JOIN nvtx_ranges AS f ON f.range_id = p.parent_range_id
            WHERE p.text IN ('schedule', 'prepare', 'forward', 'sample', 'detokenize', 'postprocess')
              AND p.domain_name = 'itertrace' AND regexp_matches(f.text, 'engine\\.py\\(\\d+\\): iteration$')""").fetchall()
        assert Counter(text for (text,) in inside) == {phase: steps for phase in
                                                     ("prepare", "forward", "sample", "detokenize", "postprocess")}


def test_host_gap_parts_add_up(traced):
    _, _, db = traced
    with QueryDB(db) as qdb:
        gaps = {(r["global_tid"], r["iteration"]): r["gap_ns"] for r in qdb.query("host_gaps").to_pylist()}
        parts: dict = {}
        for r in qdb.query("host_gaps_parts").to_pylist():
            parts[(r["global_tid"], r["iteration"])] = parts.get((r["global_tid"], r["iteration"]), 0) + r["dur_ns"]
        iterations = qdb.sql("SELECT count(*) AS n FROM iterations WHERE device_source = 'range'").column(0)[0].as_py()
    assert len(gaps) == iterations - 1 > 3
    assert parts == gaps
    assert sum(gaps.values()) > 0


def test_latency_from_the_trace_alone_matches_the_log(traced):
    _, _, db = traced
    with QueryDB(db) as qdb:
        rows = qdb.query("request_latency_compare").to_pylist()
    assert len(rows) == 6
    assert all(r["output_tokens_log"] == r["output_tokens_trace"] for r in rows)


def test_refused_where_it_cannot_work(tmp_path, capsys):
    simulated = ["run", "--workload", "worked-example", "--torch-profile", str(tmp_path / "t")]
    assert main(simulated) == 2 and "--torch-profile needs --runner torch" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main([*RUN_ARGS, "--torch-profile", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    inside = [*RUN_ARGS, "--out", str(tmp_path / "r"), "--torch-profile", str(tmp_path / "r" / "torch")]
    assert main(inside) == 2 and "inside the run directory" in capsys.readouterr().err
    overlap = [*RUN_ARGS, "--overlap", "--torch-profile", str(tmp_path / "o")]
    assert main(overlap) == 2 and "--torch-profile does not take --overlap" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
