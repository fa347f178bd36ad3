"""`itertrace experiment`: the scheduling experiments and the overlap experiment, over the engine's run flags."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from itertrace.argtypes import at_least
from itertrace.errors import UserError
from itertrace.profiler.cli import _engine_flags, _fresh_dir, _publish, spec_from_args


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("experiment", help="experiments: worked-example, slot-time, fairness, overlap")
    e.add_argument("name", choices=("worked-example", "slot-time", "fairness", "overlap"))
    _engine_flags(e)
    e.add_argument("--requests", type=at_least(20), help="slot-time: requests per workload, at least one "
                   "block of 20 of the variable mix "
                   "(default 4000 simulated; 48 torch, beside the simulated runner fitted here at 48 and 4000)")
    e.add_argument("--repeat", type=at_least(1), help="overlap: rounds, each one run without and one with overlap, "
                   "the order swapped every round (default 1)")
    e.add_argument("--no-profile", action="store_true", help="overlap: do not profile torch runs with nsys; "
                   "the figures come from the run logs")
    e.add_argument("--out", type=Path, help="also write each run's logs under this directory")
    e.add_argument("--format", choices=("table", "json"), default="table")
    # None: not given. An experiment refuses the flags it sets itself even at their usual default
    # value (cmd_experiment), and fills in the usual defaults of the others.
    e.set_defaults(func=cmd_experiment, **{dest: None for dest in _EXPERIMENT_SET})


# What each experiment sets itself, as its setup describes it: a value given for these would not be used.
_SET_BY_EXPERIMENT = {
    "worked-example": ("mode", "capacity", "requests"),
    "slot-time": ("mode", "capacity"),
    "fairness": ("mode", "policy", "capacity", "preemption", "aging", "num_blocks", "block_size", "swap_blocks",
                 "requests"),
    "overlap": ("requests", "overlap"),
}
OVERLAP_CAPACITY = 8  # the overlap experiment's usual --capacity: the worked example's eight slots
SLOT_TIME_MIN_TOKEN_BUDGET = 16 * 32  # slot-time's 16 prompts of 32 tokens in one iteration
_EXPERIMENT_SET = sorted({dest for dests in _SET_BY_EXPERIMENT.values() for dest in dests} - {"requests"})


def cmd_experiment(args: argparse.Namespace) -> int:
    from itertrace.cli import build_parser
    from itertrace.profiler import experiments
    from itertrace.profiler.summary_table import format_experiment

    for dest in _SET_BY_EXPERIMENT[args.name]:
        if getattr(args, dest) not in (None, False):
            given = "" if getattr(args, dest) is True else f" {getattr(args, dest)}"
            raise UserError(f"experiment {args.name} sets --{dest.replace('_', '-')} itself (the experiment's setup); "
                            f"leave out --{dest.replace('_', '-')}{given}")
    if args.name != "overlap" and (args.repeat is not None or args.no_profile):
        flag = "--repeat" if args.repeat is not None else "--no-profile"
        raise UserError(f"{flag}: only experiment overlap reads it")
    if args.name == "overlap" and args.capacity is None:
        args.capacity = OVERLAP_CAPACITY
    defaults = build_parser().parse_args(["run"])  # the same engine flags, with their usual defaults
    for dest in _EXPERIMENT_SET:
        if getattr(args, dest) is None:
            setattr(args, dest, getattr(defaults, dest))
    if args.requests is not None:
        from itertrace.profiler.run_limits import check_request_count

        check_request_count(args.requests, "--requests")
    if args.name == "slot-time" and args.token_budget < SLOT_TIME_MIN_TOKEN_BUDGET:
        raise UserError(f"experiment slot-time needs --token-budget of at least {SLOT_TIME_MIN_TOKEN_BUDGET} "
                        f"(16 prompts of 32 tokens at once), not {args.token_budget}")
    spec = spec_from_args(args)
    target, out = _fresh_dir(args.out) if args.out is not None else (None, None)
    try:
        if args.name == "worked-example":
            result = experiments.worked_example(spec, out)
        elif args.name == "slot-time" and spec.runner == "torch":
            cost = spec.cost if args.cost is not None else None
            result = experiments.slot_time_runners(spec, args.requests or 48, 4000, out, cost)
        elif args.name == "slot-time":
            result = experiments.slot_time(spec, args.requests or 4000, out)
        elif args.name == "overlap":
            from itertrace.experiments.overlap import overlap

            result = overlap(spec, args.repeat or 1, out, profile=not args.no_profile)
        else:
            result = experiments.fairness(spec, out=out)
        if out is not None:  # every run's logs are there: the directory takes its name
            _publish(out, target)
    finally:
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(result, indent=2) if args.format == "json" else format_experiment(result))
    return 0
