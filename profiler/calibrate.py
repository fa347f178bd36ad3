"""Fit the simulated runner's cost model to the torch runner's real iterations on this machine.

Notes
-----
The torch engine runs a short workload that mixes prefill chunks and decodes of varied batch
sizes and context lengths. Each iteration's whole duration (host phases included, since the
simulated clock has no other host time) is regressed on scheduled tokens and context tokens read:
dur = fixed + per_token * tokens + per_context_token * context, by least squares.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from itertrace.errors import UserError
from itertrace.profiler.scheduler import Decision
from itertrace.profiler.session import RunSpec, run
from itertrace.profiler.sim_runner import CostModel
from itertrace.profiler.workloads import RequestSpec, build_requests


def calibration_workload(n: int = 96, seed: int = 0) -> list[RequestSpec]:
    """Varied prompts (16-384) and outputs (8-160), all queued at once, so batch shapes sweep widely."""
    rng = np.random.default_rng(seed)
    return [RequestSpec(0, int(rng.integers(16, 385)), int(rng.integers(8, 161))) for _ in range(n)]


def calibrate(spec: RunSpec, n: int = 96, warmup: int = 5) -> tuple[CostModel, dict]:
    """Run `spec`'s runner (the torch runner, in use) and fit a CostModel; returns it with fit statistics."""
    rows: list[tuple[int, int, int]] = []

    def observe(d: Decision, start_ns: int, end_ns: int) -> None:
        rows.append((d.batch.num_tokens_total, int(d.batch.context_lens.sum()), end_ns - start_ns))

    sched = replace(spec.scheduler, max_num_seqs=max(spec.scheduler.max_num_seqs, 16),
                    max_num_batched_tokens=min(spec.scheduler.max_num_batched_tokens, 512))
    spec = replace(spec, scheduler=sched)
    # warm-up: the first forward passes of a process build kernels and fault in memory; leave them out
    run(spec, build_requests(calibration_workload(8, spec.seed + 1), seed=spec.seed))
    run(spec, build_requests(calibration_workload(n, spec.seed), seed=spec.seed), on_iteration=observe)
    data = np.array(rows[warmup:], dtype=np.float64)
    if len(data) < 10:
        raise UserError(f"calibration ran only {len(data)} iterations; need at least 10")
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    coef, *_ = np.linalg.lstsq(x, data[:, 2], rcond=None)
    coef = np.maximum(coef, 0.0)
    pred = x @ coef
    r2 = 1 - ((data[:, 2] - pred) ** 2).sum() / max(((data[:, 2] - data[:, 2].mean()) ** 2).sum(), 1e-9)
    cost = CostModel(fixed_ns=float(coef[0]), per_token_ns=float(coef[1]), per_context_token_ns=float(coef[2]),
                     source=f"calibrated on the torch runner ({len(data)} iterations)")
    stats = {"iterations": len(data), "r2": float(r2),
             "median_abs_error_pct": float(np.median(np.abs(pred - data[:, 2]) / data[:, 2]) * 100)}
    return cost, stats


def save(cost: CostModel, stats: dict, spec: RunSpec, path: Path) -> None:
    path.write_text(json.dumps({"cost_model": asdict(cost), "fit": stats, "model": asdict(spec.model)}, indent=2) + "\n")


def load(path: Path) -> CostModel:
    """Read a cost model written by `itertrace calibrate`."""
    try:
        data = json.loads(Path(path).read_text())
        return CostModel(**data["cost_model"])
    except FileNotFoundError:
        raise UserError(f"{path}: no such cost-model file") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a cost model written by `itertrace calibrate` ({type(exc).__name__}: {exc})") from None
