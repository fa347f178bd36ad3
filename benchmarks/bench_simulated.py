"""Benchmark (not a test): large workloads through the simulated runner, where the time goes, and what
running iterations in bulk (profiler/bulk.py) saves, measured side by side.

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
       python benchmarks/bench_simulated.py --trace PATH|long-prompts [--limit N] [--rounds R] [--target-s S]

`--trace` times what `itertrace run --workload PATH` does (build the requests, run them with run logs,
close the logs), in bulk (as the command runs) and one by one (Engine(bulk=False)), alternating, each
run in a process of its own so that its peak RSS is its own; it prints each side's median wall and CPU
seconds, its peak RSS, its share of the target (`--target-s`, 60 s: an hour of production arrivals in a
minute) and the ratio of the two sides, with the rounds and the machine's load. A trace file that is
not there is skipped, not an error. `long-prompts` stands in for a production conversation trace of
long prompts: 12,031 requests arriving over an hour (Poisson, 3.34 a second), prompts of 1,000 to
20,000 tokens and outputs of 50 to 650, which keep the default KV pool full (prefill chunks, preemption
and recompute almost every iteration: a prompt's chunks between the iteration that admits it and its
preemption run in bulk, and the cycles of resuming, chunks and preempting again that follow, while the
decode rows stay the same, as one chain: profiler/thrash.py). `--limit N` takes the first N requests (a
smoke run).

Compare figures within one run of this script: wall times on a shared machine move with its load.
The latest figures are in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
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
LONG_PROMPTS = ["--workload", "synthetic", "--num-requests", "12031", "--rate", "3.34",
                "--prompt-len", "uniform:1000:20000", "--output-len", "uniform:50:650"]


def timed_run(name: str, n: int, bulk: bool) -> dict:
    """One run of workload `name` with n requests: seconds (wall, CPU) per part, and what it did."""
    return timed_args(["--num-requests", str(n), *WORKLOADS[name]], bulk)


def timed_args(run_args: list[str], bulk: bool) -> dict:
    """One run of what `itertrace run RUN_ARGS` runs: seconds (wall, CPU) per part, and what it did."""
    args = top.build_parser().parse_args(["run", *run_args])
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
    return {"times": times, "iterations": result.iterations, "bulk": result.iterations_in_bulk, "events": rows["events"],
            "requests": len(requests)}


def trace_args(trace: str, limit: int | None) -> list[str] | None:
    """`itertrace run` flags for --trace (a file, or long-prompts), at most `limit` requests; None: no such file."""
    if trace == "long-prompts":
        args = LONG_PROMPTS.copy()
        if limit is not None:
            args[args.index("--num-requests") + 1] = str(min(limit, int(args[args.index("--num-requests") + 1])))
        return args
    if not Path(trace).is_file():
        return None
    return ["--workload", trace, *(["--limit", str(limit)] if limit is not None else [])]


def one_run(run_args: list[str], bulk: bool) -> dict:
    """A run in a process of its own, as `itertrace run` makes one: what timed_args gives, and the whole
    process's wall time (start-up and imports included), CPU time (all its threads) and peak RSS."""
    wall = time.perf_counter()
    child = subprocess.run([sys.executable, __file__, "--one-run", json.dumps({"args": run_args, "bulk": bulk})],
                           capture_output=True, text=True, check=False)
    wall = time.perf_counter() - wall
    if child.returncode:
        raise SystemExit(f"bench_simulated: a run failed:\n{child.stderr}")
    return json.loads(child.stdout.splitlines()[-1]) | {"wall_s": wall}


def side_by_side(trace: str, limit: int | None, rounds: int, target_s: float) -> None:
    """Runs in bulk and one by one, alternating (the order swapped every round); a table of their medians."""
    run_args = trace_args(trace, limit)
    if run_args is None:
        print(f"bench_simulated: skipped: no trace file at {trace}")
        return
    load_before = os.getloadavg()
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(rounds):
        for bulk in ((True, False) if i % 2 == 0 else (False, True)):
            runs[bulk].append(one_run(run_args, bulk))
    load_after = os.getloadavg()
    first = runs[True][0]
    print(f"{trace}: {first['requests']:,} requests, {first['iterations']:,} iterations "
          f"({first['bulk']:,} run in bulk), {first['events']:,} event rows")
    print(f"{rounds} round(s), each a run in bulk and one one by one, alternating; {os.cpu_count()} cores, "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'':<12}{'wall s':>9}{'CPU s':>9}{'peak RSS MiB':>14}{f'of {target_s:g} s target':>18}")
    wall = {}
    for bulk, label in ((True, "in bulk"), (False, "one by one")):
        wall[bulk] = statistics.median(r["wall_s"] for r in runs[bulk])
        cpu = statistics.median(r["cpu_s"] for r in runs[bulk])
        rss = max(r["peak_rss_mib"] for r in runs[bulk])
        print(f"{label:<12}{wall[bulk]:>9.2f}{cpu:>9.2f}{rss:>14.0f}{wall[bulk] / target_s:>18.2f}")
    print(f"one by one / in bulk (wall, medians): x{wall[False] / wall[True]:.2f}; "
          f"target / in bulk: x{target_s / wall[True]:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--compare", type=int, default=5_000, help="requests per side-by-side run (0: none)")
    p.add_argument("--workload", choices=(*WORKLOADS, "both"), default="both")
    p.add_argument("--trace", help="a trace file (Azure CSV, JSONL), or long-prompts: time it in bulk and one by one")
    p.add_argument("--limit", type=int, help="--trace: at most this many requests")
    p.add_argument("--rounds", type=int, default=3, help="--trace: runs of each side")
    p.add_argument("--target-s", type=float, default=60.0, help="--trace: the target wall time")
    p.add_argument("--one-run", help=argparse.SUPPRESS)  # a child process's run (see one_run)
    a = p.parse_args()
    if a.one_run:
        job = json.loads(a.one_run)
        r = timed_args(job["args"], job["bulk"])
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps(r | {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024}))
        return
    if a.trace:
        side_by_side(a.trace, a.limit, a.rounds, a.target_s)
        return
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
