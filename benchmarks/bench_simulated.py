"""Benchmark (not a test): large workloads through the simulated runner, where the time goes, and what
running iterations in bulk (Engine._run_in_bulk) saves, measured side by side.

Two workloads, all requests queued at t=0, run logs written, in this process:
- `default`: what `itertrace run --num-requests N` runs (16 slots, prompts and outputs of 128 tokens):
  long stretches of iterations where only the decode rows run, which the engine skips in bulk;
- `busy`: `--capacity 256 --output-len uniform:16:256`: about two requests finish and two start in
  almost every iteration, so nearly every iteration goes through the loop one by one.
For each: wall and CPU seconds for building the requests (synthetic prompts), the engine loop
(scheduler, cost model, logs), and closing the run logs; iterations, how many ran in bulk, peak RSS.
Then `--compare` requests of each workload run with bulk runs off and on, alternating, three rounds
in one process: the ratio of their loop times (best of three each) is the figure to watch.

Usage: python benchmarks/bench_simulated.py [--requests N] [--compare M] [--workload default|busy|both]

Measured (2-core machine, 2026-11-30), one run of this script:
  default, 100,000 requests: 800,000 iterations, 787,500 of them in bulk, 13,200,000 event rows; build
    0.88 s, loop 16.57 s (17.15 s CPU: Parquet encoding runs on a writer thread), close 0.38 s: 17.8 s
    in all, peak RSS 694 MiB.
  busy, 100,000 requests: 53,231 iterations, 1,333 in bulk; build 0.89 s, loop 37.47 s (704 us per
    iteration), close 2.71 s: 41.1 s in all, peak RSS 1,088 MiB.
  side by side, 5,000 requests, loop best of 3: default 5.18 s one by one, 0.80 s in bulk (x6.47);
    busy 2.21 s and 2.35 s (x0.94: nothing to skip; the difference is within this machine's noise).
The code before this change (c0d68e5: prompts made up front, Parquet written on the engine's thread),
run just before with `--compare 0`: default 26.3 s (build 3.96, loop 21.85), busy 42.0 s (build 3.89,
loop 36.19); this code in the same sitting: default 19.2 s (build 1.05, loop 17.61), busy 39.4 s
(build 1.46, loop 35.32). The previous day's figures for c0d68e5 were 29.2 s and 58.2 s: the machine
was slower then, so compare within one sitting only. Before bulk runs (c6fb871) the default
workload took 156.1 s.
So "100,000 requests in seconds" holds loosely for the default workload (under 20 s here, most of it
the requests' own Python work: admission, prefill, finish, logging) and not for the busy one, whose
iterations almost all change the batch.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from itertrace import cli as top
from itertrace.profiler import cli, session
from itertrace.profiler import workloads as wl

WORKLOADS = {
    "default": [],
    "busy": ["--capacity", "256", "--output-len", "uniform:16:256"],
}


def timed_run(name: str, n: int, bulk: bool) -> dict:
    """One run of workload `name` with n requests: seconds (wall, CPU) per part, and what it did."""
    args = top.build_parser().parse_args(["run", "--num-requests", str(n), *WORKLOADS[name]])
    cli._fill_workload_flags(args)  # the usual --prompt-len, --output-len, ... where not given
    spec = cli.spec_from_args(args)
    times: dict[str, tuple[float, float]] = {}

    def part(label: str, fn, *a, **kw):
        w, c = time.perf_counter(), time.process_time()
        value = fn(*a, **kw)
        times[label] = (time.perf_counter() - w, time.process_time() - c)
        return value

    requests = part("build", lambda: wl.build_requests(cli._workload(args), seed=args.seed))
    close = session._close
    session._close = lambda *x: part("close", close, *x)  # timed apart from the loop
    run_dir = Path(tempfile.mkdtemp(prefix="bench-simulated-"))
    try:
        result = part("loop+close", session.run, spec, requests, run_dir=run_dir, workload="synthetic",
                      bulk=bulk)
        rows = json.loads((run_dir / "run.json").read_text())["tables"]
    finally:
        session._close = close
        shutil.rmtree(run_dir, ignore_errors=True)
    times["loop"] = tuple(t - c for t, c in zip(times.pop("loop+close"), times["close"]))
    return {"times": times, "iterations": result.iterations, "bulk": result.iterations_in_bulk, "events": rows["events"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--compare", type=int, default=5_000, help="requests per side-by-side run (0: none)")
    p.add_argument("--workload", choices=(*WORKLOADS, "both"), default="both")
    a = p.parse_args()
    names = list(WORKLOADS) if a.workload == "both" else [a.workload]
    for name in names:
        r = timed_run(name, a.requests, True)
        t = r["times"]
        total = sum(w for w, _ in t.values())
        print(f"{name}: {a.requests:,} requests, {r['iterations']:,} iterations ({r['bulk']:,} run in bulk), "
              f"{r['events']:,} event rows, {total:.2f} s in all; peak RSS so far "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        for label in ("build", "loop", "close"):
            print(f"  {label:<6} {t[label][0]:>7.2f} s wall {t[label][1]:>7.2f} s CPU")
        print(f"  loop per iteration: {t['loop'][0] / r['iterations'] * 1e6:.1f} us")
    if a.compare:
        for name in names:
            loops: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(3):
                for ff in (False, True):
                    loops[ff].append(timed_run(name, a.compare, ff)["times"]["loop"][0])
            off, on = min(loops[False]), min(loops[True])
            print(f"{name}, {a.compare:,} requests, loop best of 3: one by one {off:.2f} s, in bulk {on:.2f} s: x{off / on:.2f}")


if __name__ == "__main__":
    main()
