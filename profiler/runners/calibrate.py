"""Fit the simulated runner's cost model to the torch runner's real iterations on this machine.

Notes
-----
The cost model (sim_runner.CostModel) prices an iteration as
    fixed + per_seq * sequences + per_token * scheduled tokens + per_context_token * context tokens read,
and the simulated clock has no other time, so the target of the fit is each iteration's whole wall
time: from its start to the next iteration's start (host phases and the engine's bookkeeping between
iterations included), as the runs' throughput sees it.

Design points. The fit is only as good as the batch shapes it sees, so the calibration runs the shapes
the engine's experiments run rather than whatever a random workload happens to make:
- decode batches of 1, 2, 4, 8 and 16 sequences (static batches of that many requests), with contexts
  from ~40 to ~1000 tokens, all equal (as in a static batch) or spread from short to long (as in a
  continuous batch), so sequences and context tokens vary independently;
- the admissions of continuous batching: short prompts joining running decodes (a continuous run of
  short-prompt requests with varied outputs), so scheduled tokens vary apart from sequences.
Prefill chunks of long prompts are set-up for the long contexts, not design points: their attention is
quadratic in the chunk, which the model does not describe (iterations with a prefill chunk longer than
`SHORT_PREFILL` tokens are left out of the fit).

Noise. The design runs `repeats` times after a warm-up run; the schedule does not depend on time, so
iteration i of a design has the same batch in every repeat, and the fit uses each iteration's median
over the repeats: a burst of load from another process lands in one repeat and drops out.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from itertools import combinations
from pathlib import Path

import numpy as np

from itertrace.errors import UserError
from itertrace.targets import hidden_file
from itertrace.profiler.scheduling.scheduler import Decision, Mode
from itertrace.profiler.session import RunSpec, make_runner, run
from itertrace.profiler.runners.sim_runner import CostModel
from itertrace.profiler.workloads import RequestSpec, build_requests

SHORT_PREFILL = 64  # longest prefill chunk an iteration may hold and still be a design point
FEATURES = ("sequences", "tokens", "context_tokens")  # the model's terms besides the fixed cost


def calibration_workload(n: int = 96, seed: int = 0) -> list[RequestSpec]:
    """Short prompts (16-64) and varied outputs (8-160), all queued at once: admissions beside decodes."""
    rng = np.random.default_rng(seed)
    return [RequestSpec(0, int(rng.integers(16, 65)), int(rng.integers(8, 161))) for _ in range(n)]


def design(n: int = 24, seed: int = 0, decode_steps: int = 12) -> list[tuple[str, Mode, int, list[RequestSpec]]]:
    """The calibration's runs: (label, mode, capacity, requests).

    Static batches of 1-16 sequences whose prompts reach 32, 256 or 1008 tokens, equal or spread (each
    batch's prompts run in one prefill iteration, then `decode_steps` decodes); then a continuous run of
    `n` short-prompt requests of varied outputs.
    """
    runs = []
    for seqs, longest in ((1, 32), (1, 1008), (2, 32), (2, 1008), (4, 32), (4, 256), (4, 1008), (8, 32), (8, 256),
                          (8, 1008), (16, 32), (16, 256), (16, 512)):
        for spread in ((False, True) if seqs > 1 and longest > 32 else (False,)):
            prompts = np.linspace(32, longest, seqs).astype(int) if spread else [longest] * seqs
            label = f"static {seqs} x {'32..' if spread else ''}{longest}"
            runs.append((label, Mode.STATIC, seqs, [RequestSpec(0, int(p), decode_steps) for p in prompts]))
    runs.append((f"continuous {n} short prompts", Mode.CONTINUOUS, 16, calibration_workload(n, seed)))
    return runs


def _observe(spec: RunSpec, mode: Mode, capacity: int, specs: list[RequestSpec], runner_and_clock) -> list[tuple]:
    """(sequences, tokens, context tokens, longest prefill chunk, wall ns to the next iteration) per iteration."""
    rows: list[list] = []

    def observe(d: Decision, start_ns: int, end_ns: int) -> None:
        b = d.batch
        if rows:
            rows[-1][-1] = start_ns - rows[-1][-1]  # the previous iteration ran until this one started
        chunk = int(b.num_tokens.max()) if b.num_seqs and b.num_tokens.max() > 1 else 0
        rows.append([b.num_seqs, b.num_tokens_total, int(b.context_lens.sum()), chunk, start_ns])

    budget = max(512, sum(r.prompt_tokens for r in specs[:capacity]))  # a static batch's prompts in one iteration
    s = replace(spec, scheduler=replace(spec.scheduler, mode=mode, max_num_seqs=capacity,
                                        max_num_batched_tokens=budget if mode is Mode.STATIC else 512))
    run(s, build_requests(specs, seed=spec.seed), on_iteration=observe, runner_and_clock=runner_and_clock)
    return [tuple(r) for r in rows[:-1]]  # the last iteration has no successor to time it by


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best unconstrained fit over subsets of the columns."""
    best, best_err = np.zeros(x.shape[1]), float(((y - 0) ** 2).sum())
    for k in range(1, x.shape[1] + 1):
        for cols in combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            err = float(((y - x[:, cols] @ coef) ** 2).sum())
            if err < best_err:
                best = np.zeros(x.shape[1])
                best[list(cols)] = coef
                best_err = err
    return best


def fit(data: np.ndarray) -> tuple[np.ndarray, dict]:
    """Fit [fixed, per_seq, per_token, per_context] to rows (sequences, tokens, context, ns); with statistics."""
    x = np.column_stack([np.ones(len(data)), data[:, :3]])
    y = data[:, 3]
    coef = nonnegative_lstsq(x, y)
    pred = x @ coef
    r2 = 1 - ((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-9)
    stats = {"iterations": len(data), "r2": float(r2),
             "median_abs_error_pct": float(np.median(np.abs(pred - y) / y) * 100),
             "total_error_pct": float((pred.sum() / y.sum() - 1) * 100)}
    return coef, stats


def calibrate(spec: RunSpec, n: int = 24, repeats: int = 3) -> tuple[CostModel, dict]:
    """Run `spec`'s runner (the torch runner, in use) over the design and fit a CostModel.

    Returns it with fit statistics, including the fit's error on each design run (`by_design`).
    """
    if repeats < 1:
        raise UserError(f"calibration repeats must be at least 1, not {repeats}")
    spec = replace(spec, scheduler=replace(spec.scheduler, chunked_prefill=True))
    runs = design(n, spec.seed)
    made = make_runner(spec)  # one model for every run: a fresh model per run would be timed cold
    # warm-up: the first forward passes of a process build kernels and fault in memory; leave them out
    _observe(spec, Mode.CONTINUOUS, 16, calibration_workload(8, spec.seed + 1), made)
    for label, mode, capacity, specs in runs[::3]:  # and one pass over the shapes, long contexts included
        _observe(spec, mode, capacity, specs, made)
    timed: list[list[list[tuple]]] = [[] for _ in runs]
    for _ in range(repeats):
        for i, (label, mode, capacity, specs) in enumerate(runs):
            timed[i].append(_observe(spec, mode, capacity, specs, made))
    points, labels = [], []
    for (label, *_), reps in zip(runs, timed):
        shapes = {tuple(r[:4] for r in rows) for rows in reps}
        if len(shapes) != 1:
            raise UserError(f"calibration run {label!r} scheduled different batches on repeats; cannot take medians")
        ns = np.median(np.array([[r[4] for r in rows] for rows in reps], dtype=np.float64), axis=0)
        for row, t in zip(reps[0], ns):
            if row[3] <= SHORT_PREFILL:
                points.append((row[0], row[1], row[2], t))
                labels.append(label)
    data = np.array(points, dtype=np.float64)
    if len(data) < 10:
        raise UserError(f"calibration kept only {len(data)} iterations; need at least 10")
    coef, stats = fit(data)
    pred = np.column_stack([np.ones(len(data)), data[:, :3]]) @ coef
    by_design = {}
    for label in dict.fromkeys(labels):
        m = np.array([lab == label for lab in labels])
        by_design[label] = {"iterations": int(m.sum()), "measured_ms": float(data[m, 3].sum() / 1e6),
                            "error_pct": float((pred[m].sum() / data[m, 3].sum() - 1) * 100)}
    stats.update(repeats=repeats, by_design=by_design)
    cost = CostModel(fixed_ns=float(coef[0]), per_seq_ns=float(coef[1]), per_token_ns=float(coef[2]),
                     per_context_token_ns=float(coef[3]),
                     source=f"calibrated on the torch runner ({len(data)} iterations, median of {repeats})")
    return cost, stats


def save(cost: CostModel, stats: dict, spec: RunSpec, path: Path) -> None:
    """Write the cost model to `path` (its first key `cost_model`, which says who wrote it), whole or not at all."""
    tmp = hidden_file(path, "tmp")
    try:
        tmp.write_text(json.dumps({"cost_model": asdict(cost), "fit": stats, "model": asdict(spec.model)},
                                  indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: Path) -> CostModel:
    """Read a cost model written by `itertrace calibrate`."""
    try:
        data = json.loads(Path(path).read_text())
        return CostModel(**data["cost_model"])
    except FileNotFoundError:
        raise UserError(f"{path}: no such cost-model file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the cost-model file ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a cost model written by `itertrace calibrate` ({type(exc).__name__}: {exc})") from None
