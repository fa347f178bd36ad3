"""One run, end to end: build clock, runner, scheduler and engine from a spec, run, log, summarize."""
from __future__ import annotations

import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from itertrace.errors import UserError
from itertrace.profiler.clock import SimClock, WallClock
from itertrace.profiler.engine import Engine, RunResult
from itertrace.profiler.gcquiet import no_full_collections
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.kv_memory import check_kv_memory
from itertrace.profiler.scheduling.request import Phase, Request
from itertrace.profiler.tracing.runlog import RunLog
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.runners.sim_runner import CostModel, SimulatedRunner


@dataclass(frozen=True)
class ModelSpec:
    """Torch runner model: a seeded random model of this size, or a local checkpoint."""

    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 688
    checkpoint: str | None = None
    device: str | None = None  # None: CUDA when present, else CPU
    threads: int | None = None  # torch CPU threads; None keeps torch's default (one per core)


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines a run besides the workload."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    runner: str = "simulated"  # "simulated" or "torch"
    num_blocks: int = 4096
    block_size: int = 16
    swap_blocks: int = 0
    seed: int = 0
    model: ModelSpec = field(default_factory=ModelSpec)
    cost: CostModel = field(default_factory=CostModel)
    overlap: bool = False  # schedule and prepare each iteration while the device runs the one before (overlap.py)


def make_runner(spec: RunSpec):
    """The clock and runner a spec asks for (torch is imported only when needed)."""
    if spec.runner == "simulated":
        check_kv_memory(spec)
        clock = SimClock()
        return clock, SimulatedRunner(clock, spec.cost)
    if spec.runner == "torch":
        import torch

        from itertrace.profiler.runners.torch.model import ModelConfig
        from itertrace.profiler.runners.torch.torch_runner import TorchRunner

        m = spec.model
        if m.threads is not None:
            torch.set_num_threads(m.threads)  # on a shared machine, 1 thread degrades far more gracefully
        try:
            config = None if m.checkpoint else ModelConfig(
                hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                num_kv_heads=m.num_kv_heads, intermediate_size=m.intermediate_size)
        except ValueError as exc:
            raise UserError(f"--hidden {m.hidden_size}, --heads {m.num_heads}, --kv-heads {m.num_kv_heads}: "
                            f"{exc}") from None
        if m.device is not None:
            try:
                kind = torch.device(m.device).type
            except RuntimeError:
                kind = None
            if kind not in ("cpu", "cuda"):
                raise UserError(f"--device {m.device!r}: expected cpu or cuda") from None
            if kind == "cuda" and not torch.cuda.is_available():
                raise UserError(f"--device {m.device}: torch finds no CUDA device here")
        from itertrace.profiler.runners.torch.checkpoint import read_config

        shape = config or read_config(Path(m.checkpoint))
        on_gpu = (torch.device(m.device).type if m.device else "cuda" if torch.cuda.is_available() else "cpu") == "cuda"
        check_kv_memory(spec, 2 * shape.num_layers * spec.block_size * shape.num_kv_heads * shape.head_dim
                        * shape.torch_dtype.itemsize, on_gpu)
        runner = TorchRunner(config, checkpoint=m.checkpoint, num_blocks=spec.num_blocks,
                             block_size=spec.block_size, swap_blocks=spec.swap_blocks,
                             device=m.device, seed=spec.seed)
        return WallClock(), runner
    raise ValueError(f"unknown runner {spec.runner!r}")


def run(spec: RunSpec, requests: list[Request], *, run_dir: Path | None = None, workload: str | dict = "",
        keep_membership: bool = False, keep_tokens: bool = False, progress=None, on_iteration=None,
        runner_and_clock=None, bulk: bool = True, make_tracer=None) -> RunResult:
    """Run `requests` under `spec`; with `run_dir`, write the run logs there; `make_tracer(clock)` makes the
    tracer in place of the NVTX one."""
    clock, runner = runner_and_clock or make_runner(spec)
    engine = _engine(spec, clock, runner, run_dir, keep_membership=keep_membership, keep_tokens=keep_tokens,
                     progress=progress, on_iteration=on_iteration, bulk=bulk,
                     tracer=make_tracer(clock) if make_tracer is not None else None)
    try:
        result = engine.run(requests)  # itself without full collections
        with no_full_collections():  # nor in the close: its last row groups are many new objects
            _close(engine, spec, workload, result)
    except BaseException:
        _abort(engine)
        raise
    return result


def _abort(engine: Engine) -> None:
    """A failed run: its logs stop being written (see RunLog.abort)."""
    if engine.log is not None:
        engine.log.abort()


def _engine(spec: RunSpec, clock, runner, run_dir: Path | None, **options) -> Engine:
    """An engine over a fresh scheduler and KV pool, logging to `run_dir` when given."""
    blocks = BlockManager(spec.num_blocks, spec.block_size, spec.swap_blocks)
    labels = {"runner": runner.name, "simulated": bool(runner.simulated)}  # as run.json says
    log = RunLog(run_dir, labels=labels) if run_dir is not None else None
    return Engine(Scheduler(spec.scheduler, blocks), runner, clock, log=log, overlap=spec.overlap, **options)


def _close(engine: Engine, spec: RunSpec, workload: str | dict, result: RunResult) -> None:
    """Finish the run's logs with run.json."""
    if engine.log is not None:
        engine.log.close(run_metadata(spec, engine.runner, engine.clock, workload, result))


def run_in_turn(jobs: list[tuple[RunSpec, list[Request], Path | None, str]]) -> list[RunResult]:
    """Run several (spec, requests, run_dir, workload) jobs in one process, one loop pass each in turn.

    For comparing timed runs on a shared machine: a burst of load from other processes falls on
    every job's iterations alike instead of on whichever run happened to be going, and each job's
    clock is paused while the others take their turns, so its times read as if it had run alone.
    A job that finishes leaves the others to go on in turn.
    """
    engines, steps, results = [], [], [None] * len(jobs)
    for spec, requests, run_dir, _ in jobs:
        clock, runner = make_runner(spec)
        clock.pause()
        engines.append(_engine(spec, clock, runner, run_dir))
        steps.append(engines[-1].steps(requests))
    live = list(range(len(jobs)))
    try:
        while live:
            for i in list(live):
                engines[i].clock.resume()
                try:
                    next(steps[i])
                except StopIteration as done:
                    results[i] = done.value
                    live.remove(i)
                    _close(engines[i], jobs[i][0], jobs[i][3], done.value)
                engines[i].clock.pause()
    except BaseException:
        for engine in engines:  # those already closed too: stopping a stopped writer does nothing
            _abort(engine)
        raise
    return results


def run_metadata(spec: RunSpec, runner, clock, workload: str | dict, result: RunResult) -> dict:
    """run.json: configuration, runner, workload, seed, versions, clock source, summary.

    `workload` is its name, or a dict of its name and the parameters that made it (config.workload)."""
    versions = {}
    for pkg in ("itertrace", "torch", "numpy", "pyarrow", "duckdb", "nvtx"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    config = asdict(spec)
    config["scheduler"] = {k: getattr(v, "value", v) for k, v in config["scheduler"].items()}
    if isinstance(workload, dict):
        config["workload"], workload = workload, workload["name"]
    return {
        "format": "itertrace-run/1",
        "config": config,
        "runner": runner.name,
        "simulated": bool(runner.simulated),
        "device": str(getattr(runner, "device", "none")),
        "device_name": _device_name(runner),
        "torch_threads": _torch_threads(runner),
        "workload": workload,
        "seed": spec.seed,
        "clock_source": clock.source,
        "clock_epoch_unix_ns": clock.epoch_unix_ns,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
        "summary": summarize(result, spec.scheduler.max_num_seqs),
    }


def _device_name(runner) -> str | None:
    """The GPU's name on a CUDA run (timings depend on it); None otherwise."""
    device = getattr(runner, "device", None)
    if device is None or device.type != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(device)


def _torch_threads(runner) -> int | None:
    """CPU threads torch used: CPU timings depend on it. None for the simulated runner."""
    if runner.simulated:
        return None
    import torch

    return torch.get_num_threads()


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(result: RunResult, capacity: int) -> dict:
    """The headline numbers: requests, tokens, iterations, idle slot-iterations, throughput, latency."""
    done = [r for r in result.requests if r.phase in (Phase.FINISHED_LENGTH, Phase.FINISHED_STOP)]
    ttft, tpot, e2e = [], [], []
    for req in done:
        t = result.times[req.request_id]
        ttft.append((t.first_token_ns - req.arrival_ns) / 1e6)
        e2e.append((t.last_token_ns - req.arrival_ns) / 1e6)
        if len(req.output_ids) > 1:
            tpot.append((t.last_token_ns - t.first_token_ns) / (len(req.output_ids) - 1) / 1e6)
    tokens = sum(len(r.output_ids) for r in done)
    wall_s = max(result.end_ns - result.start_ns, 1) / 1e9
    states: dict[str, int] = {}
    for req in result.requests:
        states[req.phase.value] = states.get(req.phase.value, 0) + 1
    return {
        "simulated": result.simulated,
        "requests": len(result.requests),
        "completed": len(done),
        "states": states,
        "output_tokens": tokens,
        "iterations": result.iterations,
        "iterations_in_bulk": result.iterations_in_bulk,  # run at once (profiler/bulk.py): same logs
        "tokens_dropped": result.tokens_dropped,  # overlap mode: computed for requests that had ended
        "slot_iterations": result.iterations * capacity,
        "idle_slot_iterations": result.idle_slot_iterations,
        "idle_held_by_finished": result.idle_finished,
        "idle_while_queued": result.idle_while_queued,
        "wall_s": wall_s,
        "throughput_tok_s": tokens / wall_s,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "tpot_ms_p50": percentile(tpot, 50), "tpot_ms_p99": percentile(tpot, 99),
        "e2e_ms_p50": percentile(e2e, 50), "e2e_ms_p99": percentile(e2e, 99),
    }
