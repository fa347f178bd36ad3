"""Benchmark (not a test): `itertrace run` with and without `--overlap`, side by side, alternating.

Each run is its own `itertrace run` process (the flags after `--`, by default the worked example on the
torch runner: `--runner torch --workload worked-example --capacity 8`), its run log written to a
temporary directory. Rounds alternate the order (off, on, then on, off, ...) so that a drift of the
machine's load falls on both modes alike. From each run:
- throughput (tokens/s) and TPOT p50 (ms), from run.json's summary;
- host-gap share: 1 - (union of the forward passes' intervals, device_start_ns..device_end_ns) / wall,
  wall being the first iteration's start_ns to the last one's end_ns, from iterations.parquet: the share
  of the run in which the device computed nothing;
- the medians of the gap between one forward pass's end and the next one's start, and of a forward pass
  (us), which a few long stalls (another process holding the cores) sway less than the totals;
- the process's CPU seconds per wall second (all of it, start-up included): well under the threads it
  could keep busy means other processes hold the cores, and overlap cannot buy CPU time it is not given.
The table gives each mode's median and range, and the ratio of the medians (on / off).

Usage: python benchmarks/bench_overlap.py [--runs N] [--json] [-- RUN FLAGS ...]
  e.g. python benchmarks/bench_overlap.py --runs 3 -- --runner torch --workload synthetic \
       --num-requests 64 --capacity 32 --hidden 1024 --intermediate 2752
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

DEFAULT_FLAGS = ["--runner", "torch", "--workload", "worked-example", "--capacity", "8"]
METRICS = ("throughput_tok_s", "tpot_ms_p50", "host_gap_share", "gap_us_p50", "forward_us_p50", "cpu_per_wall")


def forward_intervals(iterations: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """The forward passes' (starts, ends) in start order, and the wall time (first start .. last end), in ns."""
    table = pq.read_table(iterations, columns=["start_ns", "end_ns", "device_start_ns", "device_end_ns"])
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    wall = int(cols["end_ns"].max() - cols["start_ns"].min())
    has = ~np.isnan(cols["device_start_ns"].astype(float))  # idle iterations have no forward pass
    starts, ends = cols["device_start_ns"][has].astype(np.int64), cols["device_end_ns"][has].astype(np.int64)
    order = np.argsort(starts)
    return starts[order], ends[order], wall


def host_gap_share(iterations: Path) -> float:
    """1 - (union of the forward intervals) / (first start .. last end), from a run log's iterations.parquet."""
    starts, ends, wall = forward_intervals(iterations)
    busy, reach = 0, None  # merge the intervals in start order
    for s, e in zip(starts.tolist(), ends.tolist()):
        if reach is None or s > reach:
            busy, reach = busy + (e - s), e
        elif e > reach:
            busy, reach = busy + (e - reach), e
    return 1.0 - busy / wall


def median_gap_and_forward_us(iterations: Path) -> tuple[float, float]:
    """Medians of the time from one forward pass's end to the next one's start (0 where they overlap), and of
    a forward pass: less swayed than totals by a few stalls when other processes take the cores."""
    starts, ends, _ = forward_intervals(iterations)
    gaps = np.maximum(starts[1:] - np.maximum.accumulate(ends)[:-1], 0)
    return float(np.median(gaps)) / 1e3, float(np.median(ends - starts)) / 1e3


def one_run(flags: list[str], overlap: bool, out: Path) -> dict:
    """Run `itertrace run FLAGS [--overlap]` into `out`; its figures."""
    cmd = [sys.executable, "-m", "itertrace.cli", "run", *flags, "--out", str(out), "--format", "json"]
    if overlap:
        cmd.append("--overlap")
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode:
        raise SystemExit(f"bench_overlap: {' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((out / "run.json").read_text())["summary"]
    gap, forward = median_gap_and_forward_us(out / "iterations.parquet")
    return {"overlap": overlap, "throughput_tok_s": summary["throughput_tok_s"],
            "tpot_ms_p50": summary["tpot_ms_p50"], "host_gap_share": host_gap_share(out / "iterations.parquet"),
            "gap_us_p50": gap, "forward_us_p50": forward, "cpu_per_wall": cpu / wall,
            "output_tokens": summary["output_tokens"], "tokens_dropped": summary.get("tokens_dropped", 0)}


def run_all(flags: list[str], runs: int) -> list[dict]:
    """`runs` rounds, each one run without and one with overlap, the order swapped every round."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        for r in range(runs):
            for overlap in ((False, True) if r % 2 == 0 else (True, False)):
                row = one_run(flags, overlap, Path(tmp) / f"run-{r}-{int(overlap)}")
                rows.append({"round": r, **row})
                print(f"round {r} overlap={'on ' if overlap else 'off'}: "
                      + "  ".join(f"{m} {row[m]:.4g}" for m in METRICS), file=sys.stderr, flush=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per mode: median, min and max of each metric; the ratio of the medians, on / off (NaN where off is 0)."""
    out: dict = {}
    for mode in ("off", "on"):
        picked = [row for row in rows if row["overlap"] == (mode == "on")]
        out[mode] = {m: {"median": statistics.median(r[m] for r in picked), "min": min(r[m] for r in picked),
                         "max": max(r[m] for r in picked)} for m in METRICS}
    out["ratio_on_off"] = {m: out["on"][m]["median"] / out["off"][m]["median"] if out["off"][m]["median"] else math.nan
                           for m in METRICS}
    return out


def print_table(summary: dict, runs: int) -> None:
    print(f"{runs} runs each way, alternating; median [min - max]")
    print(f"{'':18} {'without overlap':>30} {'with overlap':>30} {'on/off':>7}")
    for m in METRICS:
        cells = []
        for mode in ("off", "on"):
            s = summary[mode][m]
            fmt = (lambda v: f"{100 * v:.1f}%") if m == "host_gap_share" else (lambda v: f"{v:.4g}")
            cells.append(f"{fmt(s['median'])} [{fmt(s['min'])} - {fmt(s['max'])}]")
        print(f"{m:18} {cells[0]:>30} {cells[1]:>30} {summary['ratio_on_off'][m]:>7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs each way (default 3)")
    parser.add_argument("--json", action="store_true", help="print the runs and the summary as JSON")
    parser.add_argument("flags", nargs="*", help="flags for `itertrace run` (after --)")
    args = parser.parse_args()
    flags = args.flags or DEFAULT_FLAGS
    rows = run_all(flags, args.runs)
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"flags": flags, "runs": rows, "summary": summary}, indent=1))
    else:
        print("itertrace run " + " ".join(flags))
        print_table(summary, args.runs)


if __name__ == "__main__":
    main()
