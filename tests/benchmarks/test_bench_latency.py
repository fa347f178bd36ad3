"""benchmarks/bench_latency.py runs end to end at a tiny size (one step, one round): every command it times
(the query also with the SQL of --before, here this checkout's own, and both commands with the
interpreter of --before-python, here this one) succeeds and every ratio it prints is there."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from serving_captures import path_of

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_latency.py"

pytestmark = [pytest.mark.shared, pytest.mark.slow,
              pytest.mark.skipif(not path_of("vllm_decode_full_graph_step").is_file(),
                                 reason="the shared vLLM trace is not there")]


def test_tiny_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_latency", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    own_sql = BENCH.parents[1] / "queries"
    report = bench.main(["--steps", "1", "--rounds", "1", "--out", str(tmp_path), "--before", str(own_sql),
                         "--before-python", sys.executable])
    names = {"bare DuckDB SELECT 1", "itertrace sql SELECT 1", "itertrace query gpu_time_summary",
             "  the same, SQL of --before", "sql SELECT 1, --before-python", "gpu_time_summary, --before-python"}
    assert set(report["results"]) == set(report["ratios"]) == names
    assert all(len(runs) == 1 and min(runs[0]) > 0 for runs in report["results"].values())
    assert report["ratios"]["bare DuckDB SELECT 1"] == (1.0, 1.0)
    assert "vllm_x1-noframes.duckdb: 1 steps, " in capsys.readouterr().out
    assert (tmp_path / "bench_latency.json").is_file()
