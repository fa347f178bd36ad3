"""The cost-model fit, checked against a runner whose true costs are known, and the cross-runner report."""
from __future__ import annotations

import pytest

from itertrace.profiler import experiments
from itertrace.profiler.runners.calibrate import calibrate
from itertrace.profiler.session import ModelSpec, RunSpec
from itertrace.profiler.runners.sim_runner import CostModel
from itertrace.profiler.summary_table import format_experiment


def test_calibration_recovers_a_known_cost_model():
    truth = CostModel(fixed_ns=3_000_000, per_token_ns=45_000, per_context_token_ns=900)
    fitted, stats = calibrate(RunSpec(runner="simulated", cost=truth), n=32)
    assert stats["r2"] == pytest.approx(1.0)
    assert fitted.fixed_ns == pytest.approx(truth.fixed_ns, rel=1e-6)
    assert fitted.per_token_ns == pytest.approx(truth.per_token_ns, rel=1e-6)
    assert fitted.per_context_token_ns == pytest.approx(truth.per_context_token_ns, rel=1e-6)


@pytest.mark.slow
def test_torch_and_simulated_runners_see_the_same_schedule(capsys):
    spec = RunSpec(model=ModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=2,
                                   intermediate_size=128), num_blocks=1200)
    result = experiments.slot_time_runners(spec, n_torch=20, n_full=60)
    stages = [line.split(" ", 3)[-1] for line in capsys.readouterr().err.splitlines()]  # "  HH:MM:SS text"
    assert stages == ["slot-time: fitting the simulated runner's cost model to the torch runner",
                      "slot-time: a warm-up run", "slot-time: the four torch runs of 20 requests, an iteration each in turn",
                      "slot-time: the simulated runner at 20 and 60 requests"]  # minutes of torch runs are not silent
    a = result["agreement"]
    torch_rows = {(r["workload"], r["mode"]): r for r in result["rows"]}
    # the schedule does not depend on time: iterations and idle slots match the simulated run exactly
    same_size = experiments.slot_time(RunSpec(num_blocks=1200, cost=CostModel(**{
        k: a["cost_model"][k] for k in ("fixed_ns", "per_seq_ns", "per_token_ns", "per_context_token_ns")})), 20)
    for row in same_size["rows"]:
        t = torch_rows[(row["workload"], row["mode"])]
        assert (t["iterations"], t["idle_slot_iterations"]) == (row["iterations"], row["idle_slot_iterations"])
    assert set(a["relative_diff"]) == {"uniform", "variable"} and a["fit"]["iterations"] > 10
    assert result["in_turn"]  # the four torch runs went an iteration each in turn
    for kind in ("uniform", "variable"):  # the ratio of ratios is the simulated ratio over the torch ratio
        assert a["ratio_of_ratios"][kind] == pytest.approx(a["simulated_ratios"][kind] / a["torch_ratios"][kind])
    text = format_experiment(result)
    assert "torch runner (" in text and "simulated/torch - 1" in text and "largest difference" in text
    agreement = text[text.index("simulated/torch - 1"):].splitlines()
    for kind in ("uniform", "variable"):
        line = next(x for x in agreement if x.split()[:1] == [kind])
        assert f"{a['torch_ratios'][kind]:.4g}" in line and f"{100 * (a['ratio_of_ratios'][kind] - 1):+.1f}%" in line
