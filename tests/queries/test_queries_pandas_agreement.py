"""Two independent computations agree: the SQL views and the pandas reference of the benchmark.

benchmarks/pandas_reference.py computes gap attribution (`host_gaps_parts`) and TTFT reconstruction
from the run log (`request_latency_log`: TTFT, TPOT, tokens) with pandas; on both sample captures its
rows equal the views' rows exactly. benchmarks/bench_queries.py times the two at a million iterations.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from itertrace.queries import QueryDB

pd = pytest.importorskip("pandas")

pytestmark = pytest.mark.nsys

REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "pandas_reference.py"
MODES = ("static", "continuous")


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("pandas_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same(sql: pd.DataFrame, ref: pd.DataFrame, keys: list[str]) -> None:
    assert list(ref.columns) == list(sql.columns)
    sql = sql.sort_values(keys).reset_index(drop=True)
    ref = ref.sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(ref, sql, check_dtype=False, check_exact=True)


@pytest.mark.parametrize("mode", MODES)
def test_gap_attribution_pandas_equals_host_gaps_parts(sample_dbs, reference, mode):
    with QueryDB(sample_dbs[mode]) as db:
        sql = db.query("host_gaps_parts").to_pandas()
        iterations = db.sql("SELECT count(*) AS n FROM iterations").to_pylist()[0]["n"]
        ref = reference.gap_parts(reference.load_ranges(db.con))
    # Something to compare: every gap between the run's iterations, each split into its phases.
    assert sql["iteration"].nunique() == iterations - 1
    assert set(sql["phase"]) == {"schedule", "prepare", "sample", "detokenize", "postprocess", "unattributed"}
    _same(sql, ref, ["global_tid", "iteration", "phase"])


@pytest.mark.parametrize("mode", MODES)
def test_ttft_tpot_tokens_pandas_equal_request_latency_log(sample_dbs, reference, mode):
    with QueryDB(sample_dbs[mode]) as db:
        sql = db.sql("SELECT request_id, ttft_ns, tpot_ns, output_tokens FROM request_latency_log").to_pandas()
        ref = reference.log_latency(reference.load_events(db.con), reference.load_requests(db.con))
    assert len(sql) == 16 and (sql["output_tokens"] > 1).all()
    _same(sql, ref, ["request_id"])
