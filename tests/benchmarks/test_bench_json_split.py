"""benchmarks/bench_json_split.py runs end to end at a tiny size (one step, one round): every way whose library
is installed gives a run, and the splitter and the standard library's and DuckDB's ways are always there."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from serving_captures import path_of

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_json_split.py"

pytestmark = [pytest.mark.shared, pytest.mark.slow,
              pytest.mark.skipif(not path_of("vllm_decode_full_graph_step").is_file(),
                                 reason="the shared vLLM trace is not there")]


def test_tiny_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_json_split", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--steps", "1", "--rounds", "1", "--out", str(tmp_path)])
    runs = report["vllm_x1.json.gz"]["runs"]
    assert {"split_trace", "json.load whole", "DuckDB whole"} <= set(runs)
    assert set(runs) == {name for name, (module, _, _) in bench.WAYS.items() if importlib.util.find_spec(module)}
    assert all(len(r) == 1 and min(r[0]) > 0 for r in runs.values())
    printed = capsys.readouterr().out
    assert "vllm_x1.json.gz: " in printed and "split_trace" in printed
