"""`itertrace demo`: the whole product on its built-in defaults, from the seed's experiments to a report."""
from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path

from itertrace.profiler import experiments
from itertrace.profiler import workloads as wl
from itertrace.profiler.session import RunSpec, run
from itertrace.profiler.summary_table import format_experiment, format_summary


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="the seed's experiments and a live torch run, on the built-in defaults")
    d.add_argument("--out", type=Path, default=Path("out/demo"), help="where the run logs go (replaced)")
    d.add_argument("--requests", type=int, default=4000, help="slot-time requests per workload (simulated)")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Worked example, slot-time and fairness on the simulated runner, then a short live torch run."""
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    spec = RunSpec()
    for name, result in (
        ("worked example", experiments.worked_example(spec, out)),
        ("stranded slot-time", experiments.slot_time(spec, args.requests, out)),
        ("fairness", experiments.fairness(spec, out=out)),
    ):
        print(f"== {name} ==\n{format_experiment(result)}\n", flush=True)
    live = replace(spec, runner="torch", scheduler=replace(spec.scheduler, max_num_seqs=8))
    reqs = wl.build_requests(wl.worked_example(short=16, long=64, waiting=8), seed=0)
    run(live, reqs, run_dir=out / "live-torch", workload="worked-example (short)")
    meta = json.loads((out / "live-torch" / "run.json").read_text())
    print(f"== live torch run ({meta['device']}) ==\n"
          f"{format_summary(meta['summary'], 'torch', str(out / 'live-torch'))}")
    return 0
