"""Multi-step captures built from the shared vLLM and SGLang step traces (serving_captures.py) ingest to N times
the one step: every category's events, frames, kernels, correlations, and the same nesting in each step."""
from __future__ import annotations

import json
from collections import Counter

import duckdb
import pytest
from serving_captures import NAMES, build, path_of

from itertrace.ingest import ingest

STEPS = {"vllm_decode_full_graph_step": 50, "sglang_qwen3_8b_decode_step": 50,
         "sglang_qwen3_8b_prefill_decode_step": 3}  # 60,315 events a step

pytestmark = pytest.mark.shared


def facts(db) -> dict:
    """What must scale with the steps: counts by category, ranges by kind, GPU ops, correlated pairs, nesting."""
    with duckdb.connect(str(db), read_only=True) as con:
        return {
            "events": con.execute("SELECT events FROM kineto_sources").fetchall()[0][0],
            "by_cat": json.loads(con.execute("SELECT events_by_cat FROM kineto_sources").fetchall()[0][0]),
            "ranges": dict(con.execute("SELECT range_kind, count(*) FROM nvtx_ranges GROUP BY 1").fetchall()),
            "gpu_ops": dict(con.execute("SELECT kind, count(*) FROM gpu_ops GROUP BY 1").fetchall()),
            "correlated": con.execute("""SELECT count(*) FROM gpu_ops AS g JOIN cuda_api AS a
                                         ON a.correlation_id = g.correlation_id AND a.global_pid = g.global_pid""")
                             .fetchall()[0][0],
            "projected": con.execute("SELECT count(*), sum(gpu_op_count) FROM nvtx_gpu_projection").fetchall()[0],
            "nesting": Counter(con.execute("""
                SELECT r.text, r.depth, p.text FROM nvtx_ranges AS r
                LEFT JOIN nvtx_ranges AS p ON p.range_id = r.parent_range_id""").fetchall()),
            "op_parents": Counter(con.execute("""
                SELECT o.name, p.text FROM kineto_cpu_ops AS o
                LEFT JOIN nvtx_ranges AS p ON p.range_id = o.parent_range_id""").fetchall()),
            "gpu_starts": [s for (s,) in con.execute("SELECT start_ns FROM gpu_ops ORDER BY start_ns").fetchall()],
        }


@pytest.mark.parametrize("name", NAMES)
def test_n_steps_are_n_times_one_step(tmp_path, name):
    if not path_of(name).is_file():
        pytest.skip(f"{path_of(name)} not found")
    steps = STEPS[name]
    built = build(name, steps, tmp_path / f"{name}.json")
    ingest([path_of(name)], tmp_path / "one.duckdb")
    ingest([built], tmp_path / "many.duckdb")
    one, many = facts(tmp_path / "one.duckdb"), facts(tmp_path / "many.duckdb")
    assert many["events"] == steps * one["events"]
    assert many["by_cat"] == {cat: steps * n for cat, n in one["by_cat"].items()}
    assert many["ranges"] == {kind: steps * n for kind, n in one["ranges"].items()}
    assert many["ranges"]["python_frame"] == steps * one["by_cat"]["python_function"]
    assert many["gpu_ops"] == {kind: steps * n for kind, n in one["gpu_ops"].items()}
    assert many["correlated"] == steps * one["correlated"] > 0
    assert many["projected"] == tuple(steps * n for n in one["projected"])
    assert many["nesting"] == Counter({key: steps * n for key, n in one["nesting"].items()})
    assert many["op_parents"] == Counter({key: steps * n for key, n in one["op_parents"].items()})
    # each step is the first moved by whole microseconds, one after the other
    n = len(one["gpu_starts"])
    shifts = {many["gpu_starts"][k * n + i] - start for k in range(steps) for i, start in enumerate(one["gpu_starts"])}
    assert len(shifts) == steps and min(shifts) == 0 and all(s % 1000 == 0 for s in shifts)


def test_a_dropped_category_leaves_every_other_event(tmp_path):
    name = "vllm_decode_full_graph_step"
    if not path_of(name).is_file():
        pytest.skip(f"{path_of(name)} not found")
    ingest([path_of(name)], tmp_path / "one.duckdb")
    ingest([build(name, 2, tmp_path / "t.json", drop=frozenset({"python_function"}))], tmp_path / "bare.duckdb")
    one, bare = facts(tmp_path / "one.duckdb"), facts(tmp_path / "bare.duckdb")
    assert bare["by_cat"] == {cat: 2 * n for cat, n in one["by_cat"].items() if cat != "python_function"}
    assert bare["ranges"] == {"push_pop": 2 * one["ranges"]["push_pop"]}
    assert bare["gpu_ops"] == {kind: 2 * n for kind, n in one["gpu_ops"].items()}
