"""`itertrace run`, `itertrace calibrate`: the engine's commands (`itertrace experiment` is in itertrace.experiments)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from itertrace.argtypes import at_least
from itertrace.errors import UserError
from itertrace.targets import Kind, remove_leftovers, replaceable

# The engine (numpy, pyarrow) is imported by the commands that run it, not to build the parser:
# `itertrace --help` and the other parts' commands do not pay for it.
if TYPE_CHECKING:
    from itertrace.profiler.session import RunSpec
    from itertrace.profiler.workloads import RequestSpec

WORKLOADS = ("worked-example", "slot-time-uniform", "slot-time-variable", "synthetic")
# The values of Mode, Policy and PreemptKind, written out for the same reason (tests check they agree).
MODES = ("static", "continuous")
POLICIES = ("fcfs", "srw", "edf", "priority")
PREEMPTIONS = ("recompute", "swap", "reject")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a workload through the reference engine and write its run logs")
    _engine_flags(p)
    p.add_argument("--workload", default="synthetic",
                   help=f"one of {', '.join(WORKLOADS)}, or a trace file (.csv Azure format, .jsonl)")
    p.add_argument("--num-requests", type=at_least(1), help="synthetic and slot-time workloads (default 64)")
    p.add_argument("--rate", type=float, help="synthetic: arrivals per second (default 0: all at once)")
    p.add_argument("--cv", type=float, help="synthetic: gamma inter-arrival coefficient of variation (default 1: Poisson)")
    p.add_argument("--prompt-len", help="synthetic: N, uniform:LO:HI or choice:A,B@PA,PB (default 128)")
    p.add_argument("--output-len", help="synthetic: N, uniform:LO:HI or choice:A,B@PA,PB (default 128)")
    p.add_argument("--limit", type=at_least(1), help="trace files: read at most this many requests")
    p.add_argument("--time-scale", type=_scale, help="trace files: divide arrival times by this (default 1)")
    p.add_argument("--out", type=Path, help="run directory to create (default: runs/<time>)")
    p.add_argument("--torch-profile", type=Path, metavar="DIR",
                   help="torch runner: also record the run with torch.profiler, its trace written to DIR/trace.json.gz")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_run)

    c = sub.add_parser("calibrate", help="fit the simulated runner's cost model to the torch runner here")
    _engine_flags(c)
    c.add_argument("--out", type=Path, default=Path("cost-model.json"))
    c.set_defaults(func=cmd_calibrate)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduler")
    g.add_argument("--mode", choices=MODES, default="continuous")
    g.add_argument("--policy", choices=POLICIES, default="fcfs")
    g.add_argument("--capacity", type=at_least(1), default=16, help="sequence budget: slots per batch")
    g.add_argument("--token-budget", type=at_least(1), default=2048, help="tokens per iteration")
    g.add_argument("--no-chunked-prefill", action="store_true", help="a prompt must fit one iteration")
    g.add_argument("--decode-reserve", type=_share, default=0.0, help="share of the token budget prefill never uses")
    g.add_argument("--preemption", choices=PREEMPTIONS, default="recompute")
    g.add_argument("--aging", type=at_least(1), default=256, help="priority policy: iterations of waiting worth one class")
    k = p.add_argument_group("KV cache")
    k.add_argument("--block-size", type=at_least(1), default=16)
    k.add_argument("--num-blocks", type=at_least(1), default=4096)
    k.add_argument("--swap-blocks", type=at_least(0), default=0, help="swap pool size, for --preemption swap")
    r = p.add_argument_group("runner")
    r.add_argument("--runner", choices=("simulated", "torch"), default="simulated")
    r.add_argument("--cost", type=Path, help="simulated runner: cost model from `itertrace calibrate`")
    r.add_argument("--hidden", type=at_least(1), default=256)
    r.add_argument("--layers", type=at_least(1), default=4)
    r.add_argument("--heads", type=at_least(1), default=4)
    r.add_argument("--kv-heads", type=at_least(1), default=4)
    r.add_argument("--intermediate", type=at_least(1), default=688)
    r.add_argument("--checkpoint", help="torch runner: a local Llama-style checkpoint directory")
    r.add_argument("--device", help="torch runner: cpu or cuda (default: cuda when present)")
    r.add_argument("--threads", type=at_least(1), default=1,
                   help="torch runner: CPU threads (default 1: torch's default of one per core slows down many "
                        "times over when another process holds a core)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--overlap", action="store_true",
                   help="schedule and prepare each iteration while the device runs the one before")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    from itertrace.profiler.scheduling.policies import Policy
    from itertrace.profiler.scheduling.request import PreemptKind
    from itertrace.profiler.scheduling.scheduler import Mode, SchedulerConfig
    from itertrace.profiler.session import ModelSpec, RunSpec

    sched = SchedulerConfig(
        mode=Mode(args.mode), policy=Policy(args.policy), max_num_seqs=args.capacity,
        max_num_batched_tokens=args.token_budget, chunked_prefill=not args.no_chunked_prefill,
        decode_reserve=args.decode_reserve, preemption=PreemptKind(args.preemption), aging_iterations=args.aging)
    if args.preemption == "swap" and args.swap_blocks < 1:
        raise UserError("--preemption swap needs --swap-blocks of at least 1")
    model = ModelSpec(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                      num_kv_heads=args.kv_heads, intermediate_size=args.intermediate,
                      checkpoint=args.checkpoint, device=args.device, threads=args.threads)
    spec = RunSpec(scheduler=sched, runner=args.runner, num_blocks=args.num_blocks, block_size=args.block_size,
                   swap_blocks=args.swap_blocks, seed=args.seed, model=model, overlap=args.overlap)
    if args.cost is not None:
        from itertrace.profiler.runners.calibrate import load

        spec = replace(spec, cost=load(args.cost))
    return spec


# The workload flags: their usual values, and the workloads that read them. They default to None, so that
# `run` can refuse one given to a workload that would not read it (a --limit on a synthetic workload).
_WORKLOAD_FLAGS = {
    "num_requests": (64, ("synthetic", "slot-time-uniform", "slot-time-variable")),
    "rate": (0.0, ("synthetic",)),
    "cv": (1.0, ("synthetic",)),
    "prompt_len": ("128", ("synthetic",)),
    "output_len": ("128", ("synthetic",)),
    "limit": (None, ("trace file",)),
    "time_scale": (1.0, ("trace file",)),
}


def _fill_workload_flags(args: argparse.Namespace) -> None:
    """Refuse a workload flag the workload does not read; give the others their usual values."""
    kind = args.workload if args.workload in WORKLOADS else "trace file"
    for dest, (usual, readers) in _WORKLOAD_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            setattr(args, dest, usual)
        elif kind not in readers:
            flag = "--" + dest.replace("_", "-")
            who = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} and {readers[-1]}"
            raise UserError(f"{flag} {value}: --workload {args.workload} does not read it (only {who} workloads do)")


def _workload(args: argparse.Namespace) -> list[RequestSpec]:
    from itertrace.profiler import workloads as wl

    name = args.workload
    if name == "worked-example":
        return wl.worked_example()
    if name in ("slot-time-uniform", "slot-time-variable"):
        return wl.slot_time(name.rsplit("-", 1)[1], args.num_requests, seed=args.seed)
    if name == "synthetic":
        for flag, text in (("--prompt-len", args.prompt_len), ("--output-len", args.output_len)):
            wl.parse_lengths(text, flag)  # refused here, the flag named
        return wl.synthetic(args.num_requests, rate=args.rate, cv=args.cv, prompt=args.prompt_len,
                            output=args.output_len, seed=args.seed)
    if Path(name).suffix.lower() in (".csv", ".jsonl", ".json"):
        return wl.load_trace(Path(name), limit=args.limit, time_scale=args.time_scale)
    raise UserError(f"--workload {name!r}: expected one of {', '.join(WORKLOADS)} or a .csv/.jsonl trace file")


def _workload_params(args: argparse.Namespace) -> dict:
    """The workload's name and the flags that made it, for run.json (config.workload): enough to run it again."""
    name = args.workload
    if name == "synthetic":
        return {"name": name, "num_requests": args.num_requests, "rate": args.rate, "cv": args.cv,
                "prompt_len": args.prompt_len, "output_len": args.output_len}
    if name in ("slot-time-uniform", "slot-time-variable"):
        return {"name": name, "num_requests": args.num_requests}
    if name == "worked-example":
        return {"name": name}
    return {"name": name, "path": str(Path(name).resolve()), "limit": args.limit, "time_scale": args.time_scale}


class _Progress:
    """Prints a progress line to stderr at most every two seconds, for long runs."""

    def __init__(self, total: int) -> None:
        self.total, self.t0, self.last = total, time.monotonic(), time.monotonic()

    def __call__(self, iteration: int, arrived: int) -> None:
        now = time.monotonic()
        if now - self.last >= 2.0:
            self.last = now
            print(f"  iteration {iteration:,}, {arrived:,}/{self.total:,} requests arrived, "
                  f"{now - self.t0:.0f} s", file=sys.stderr, flush=True)


def _fresh_dir(out: Path | None) -> tuple[Path, Path]:
    """A hidden directory beside the target (itertrace.targets); renamed into place when the run completes."""
    from itertrace.targets import hidden_folder, remove_leftovers

    target = out or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")
    try:
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise UserError(f"--out {target}: already exists and is not empty; choose another directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(target)  # of runs killed before they could clean up
        return target, hidden_folder(target, "work")
    except OSError as exc:
        why = f"{exc.filename} is a file" if isinstance(exc, FileExistsError) else exc.strerror
        raise UserError(f"--out {target}: cannot create it ({why})") from None


@contextlib.contextmanager
def _writing(target: Path, tmp: Path) -> Iterator[None]:
    """Remove the hidden directory `tmp` however the block ends; a write the file system refuses is one line."""
    from itertrace.targets import write_failure

    try:
        yield
    except OSError as exc:
        if why := write_failure(exc):
            raise UserError(f"--out {target}: cannot write the run directory ({why}); nothing was kept") from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, target: Path) -> None:
    """Rename the finished temporary directory (see _fresh_dir) to its target, an absent or empty directory."""
    if target.exists():
        target.rmdir()
    tmp.chmod(0o755)
    os.replace(tmp, target)


def cmd_run(args: argparse.Namespace) -> int:
    from itertrace.profiler import workloads as wl
    from itertrace.profiler.run_limits import check_lengths, check_request_count
    from itertrace.profiler.session import run
    from itertrace.profiler.summary_table import format_summary

    spec = spec_from_args(args)
    _fill_workload_flags(args)
    if args.workload in _WORKLOAD_FLAGS["num_requests"][1]:
        check_request_count(args.num_requests, "--num-requests")
    specs = _workload(args)
    named = ((f"--prompt-len {args.prompt_len}", f"--output-len {args.output_len}") if args.workload == "synthetic"
             else (f"--workload {args.workload}",) * 2)
    notes = check_lengths(specs, spec, *named)
    reqs = wl.build_requests(specs, seed=args.seed)
    profiling = _torch_profile(args, spec)
    target, tmp = _fresh_dir(args.out)
    with _writing(target, tmp):
        with profiling as make_tracer:
            run(spec, reqs, run_dir=tmp, workload=_workload_params(args), progress=_Progress(len(reqs)),
                make_tracer=make_tracer)
        _publish(tmp, target)
    meta = json.loads((target / "run.json").read_text())
    if args.torch_profile is not None:
        print(f"itertrace: torch.profiler trace: {args.torch_profile / 'trace.json.gz'}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"run_dir": str(target), **meta["summary"]}, indent=2))
    else:
        print(format_summary(meta["summary"], spec.runner, str(target)))
    for note in notes:
        print(f"itertrace: note: {note}", file=sys.stderr)
    return 0


def _torch_profile(args: argparse.Namespace, spec: RunSpec):
    """The context a run goes in: torch.profiler's for --torch-profile DIR (it yields the tracer's class), else none."""
    if args.torch_profile is None:
        return contextlib.nullcontext()
    if spec.runner != "torch":
        raise UserError("--torch-profile needs --runner torch: a simulated run's times come from a cost model")
    if spec.overlap:
        raise UserError("--torch-profile does not take --overlap: overlapping steps are start/end ranges, which "
                        "torch.profiler's nested ranges cannot stand for; profile an overlap run with nsys")
    folder = args.torch_profile.resolve()
    if args.out is not None and (args.out.resolve() == folder or args.out.resolve() in folder.parents):
        raise UserError(f"--torch-profile {args.torch_profile}: inside the run directory; give a folder outside it")
    from itertrace.profiler.tracing.torch_profile import check_folder, profiled

    check_folder(args.torch_profile)
    return profiled(args.torch_profile, spec.model.device)


POOR_FIT_R2 = 0.8  # calibrate warns below this (one thread here fit at 0.91 beside a busy test suite and 0.94 on
# a quieter machine; two threads beside the busy suite, at 0.37)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from itertrace.profiler.runners.calibrate import calibrate, save

    spec = replace(spec_from_args(args), runner="torch")
    if spec.overlap:
        raise UserError("--overlap: calibrate times iterations run one after the other; leave it out")
    out = replaceable(args.out, Kind.COST_MODEL, "--out")  # before the minutes calibrating takes
    remove_leftovers(out)
    cost, stats = calibrate(spec)
    save(cost, stats, spec, out)
    print(f"fixed {cost.fixed_ns / 1e6:.3f} ms + {cost.per_seq_ns / 1e3:.1f} us/sequence + "
          f"{cost.per_token_ns / 1e3:.2f} us/token + "
          f"{cost.per_context_token_ns:.1f} ns/context token (R^2 {stats['r2']:.3f}, "
          f"{stats['iterations']} iterations); wrote {args.out}")
    if stats["r2"] < POOR_FIT_R2:
        print(f"itertrace: warning: a poor fit (R^2 {stats['r2']:.2f}, median error "
              f"{stats['median_abs_error_pct']:.0f}%): iteration times were noisy, likely another process "
              "on these cores; the simulated runner will be off by as much. Calibrate again on a quiet machine.",
              file=sys.stderr)
    return 0
