"""The calibration's design and fit, on the simulated runner (whose costs are known) and on synthetic data.

No timings: the machine is shared and noisy; these check the model's structure and the fit.
"""
from __future__ import annotations

import numpy as np
import pytest

from itertrace.profiler.runners.calibrate import SHORT_PREFILL, design, fit, nonnegative_lstsq
from itertrace.profiler.scheduling.scheduler import Mode


def test_fit_recovers_four_terms_from_noisy_synthetic_iterations():
    rng = np.random.default_rng(0)
    seqs = rng.integers(1, 17, 400)
    tokens = seqs + rng.integers(0, 4, 400) * 32  # decodes plus a few 32-token admissions
    context = seqs * rng.integers(40, 1100, 400)
    truth = np.array([7e6, 2e5, 1.5e5, 5e3])
    ns = truth[0] + truth[1] * seqs + truth[2] * tokens + truth[3] * context
    ns = ns * rng.normal(1, 0.02, 400)
    coef, stats = fit(np.column_stack([seqs, tokens, context, ns]).astype(float))
    np.testing.assert_allclose(coef, truth, rtol=0.1)
    assert stats["r2"] > 0.98 and abs(stats["total_error_pct"]) < 1


def test_nonnegative_fit_drops_a_term_rather_than_make_it_negative():
    x = np.column_stack([np.ones(50), np.arange(50.0), np.zeros(50) + np.linspace(0, 1, 50) ** 2])
    y = 3 + 2 * np.arange(50.0) - 0.5 * x[:, 2]
    coef = nonnegative_lstsq(x, y)
    assert (coef >= 0).all() and coef[2] == 0


def test_design_covers_the_slot_time_experiments_batch_shapes():
    runs = design()
    static = [(cap, [r.prompt_tokens for r in reqs]) for _, mode, cap, reqs in runs if mode is Mode.STATIC]
    assert {cap for cap, _ in static} >= {1, 2, 4, 8, 16}  # every batch size the experiment's tails pass through
    assert max(max(p) for _, p in static) >= 1000  # the 1024-token outputs' contexts
    assert any(len(set(p)) > 1 for _, p in static) and any(len(set(p)) == 1 for _, p in static)  # spread and equal
    cont = [reqs for _, mode, _, reqs in runs if mode is Mode.CONTINUOUS]
    assert cont and all(r.prompt_tokens <= SHORT_PREFILL for r in cont[0])  # admissions as the experiment makes


def test_calibration_on_the_simulated_runner_recovers_a_per_sequence_term():
    from itertrace.profiler.runners.calibrate import calibrate
    from itertrace.profiler.session import RunSpec
    from itertrace.profiler.runners.sim_runner import CostModel

    truth = CostModel(fixed_ns=3e6, per_seq_ns=2e5, per_token_ns=4.5e4, per_context_token_ns=900)
    fitted, stats = calibrate(RunSpec(runner="simulated", cost=truth), n=16, repeats=1)
    assert stats["r2"] == pytest.approx(1.0)
    for name in ("fixed_ns", "per_seq_ns", "per_token_ns", "per_context_token_ns"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)
