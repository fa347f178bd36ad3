"""benchmarks/bench_kineto.py runs end to end at a tiny size (one step, one round, no HTA): every command it
times succeeds and every ratio it prints is there."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from serving_captures import path_of

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kineto.py"

pytestmark = [pytest.mark.shared, pytest.mark.slow,
              pytest.mark.skipif(not path_of("vllm_decode_full_graph_step").is_file(),
                                 reason="the shared vLLM trace is not there")]


def test_tiny_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_kineto", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--steps", "1", "--rounds", "1", "--out", str(tmp_path)])
    assert set(report["results"]) == {
        "ingest, frames", "ingest, no frames", "ingest + gpu_time_summary", "  the same, --store never", "json.load",
        "gpu_time_summary, frames", "gpu_time_summary, no frames", "iterations, frames", "iterations, no frames",
        "mapping suggest, frames", "mapping suggest, no frames"}
    assert all(len(runs) == 1 and min(runs[0]) > 0 for runs in report["results"].values())
    assert set(report["ratios"]) == {"ingest: frames / no frames", "gpu_time_summary: frames / no frames",
                                     "iterations: frames / no frames", "mapping suggest: frames / no frames"}
    assert "vllm_x1.json.gz: 1 steps, 1,993 events" in capsys.readouterr().out
    assert (tmp_path / "bench_kineto.json").is_file()
