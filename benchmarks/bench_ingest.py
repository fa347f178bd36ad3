"""Benchmark (not a test): ingest of a large real nsys capture, beside nsys's own SQLite export + nvtxsum.

Captures a Python program that emits STEPS nested NVTX push/pop ranges per step (a `step` range with
the step number as payload around `schedule`, `forward`, `sample`, each with a payload) plus one mark
per step, under `nsys profile --trace=nvtx,osrt`, then measures in one run, each in its own process:

- `itertrace ingest REPORT.nsys-rep` (nsys export to Arrow included): wall time, rows/s, peak memory;
- the same with `--memory-limit`, to show memory bounded by the limit rather than the trace;
- the parts: `nsys export --type arrow` alone, and `itertrace ingest` of that .arrow alone;
- `nsys export --type sqlite` and `nsys stats --report nvtxsum` on that .sqlite.

Peak memory is the peak RSS of the process and its waited-for children (wait4), and the peak anonymous
RSS of the process itself (sampled from /proc every 20 ms; file-backed pages of the memory-mapped
Arrow export are not counted there). Usage: python benchmarks/bench_ingest.py [--steps N] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from itertrace.ingest.nsys import Nsys, find_nsys, profile

PROGRAM = """
import sys
import nvtx

for step in range(int(sys.argv[1])):
    nvtx.push_range("step", domain="itertrace", payload=step)
    for phase in ("schedule", "forward", "sample"):
        nvtx.push_range(phase, domain="itertrace", payload=step)
        nvtx.pop_range(domain="itertrace")
    nvtx.mark("arrive", domain="itertrace", payload=step)
    nvtx.pop_range(domain="itertrace")
"""


@dataclass(frozen=True)
class Run:
    """One measured command."""

    name: str
    wall_s: float
    peak_rss_mb: float  # the process and its waited-for children
    peak_anon_mb: float  # the process itself, sampled
    returncode: int


def measure(name: str, argv: list[str]) -> tuple[Run, str]:
    """Run `argv` to completion; its measurements and its stderr."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        peak_anon = _sample_anon(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    run = Run(name, wall, usage.ru_maxrss / 1024, peak_anon() / 1024, proc.returncode)
    if run.returncode != 0:
        raise SystemExit(f"{name} failed (exit {run.returncode}): {stderr.strip()[-500:]}")
    return run, stderr


def _sample_anon(pid: int):
    peak = [0]

    def sample() -> None:
        path = f"/proc/{pid}/status"
        while True:
            try:
                with open(path) as status:
                    for line in status:
                        if line.startswith("RssAnon:"):
                            peak[0] = max(peak[0], int(line.split()[1]))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                return
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()

    def result() -> int:
        thread.join(timeout=1)
        return peak[0]

    return result


def capture(out: Path, steps: int, nsys: Nsys) -> tuple[Path, float]:
    """The report of STEPS steps (made once, reused after), and the seconds the capture took."""
    report = out / f"nvtx_{steps}.nsys-rep"
    if report.is_file():
        return report, float("nan")
    program = out / "emit_nvtx.py"
    program.write_text(PROGRAM)
    started = time.perf_counter()
    done = profile([sys.executable, str(program), str(steps)], report, nsys, traces=("nvtx", "osrt"),
                   log=out / "nsys-profile.log")
    if done.returncode != 0:
        raise SystemExit(f"the profiled program failed; see {out / 'nsys-profile.log'}")
    return report, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250_000, help="steps; 4 ranges and 1 mark each (default 250000)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench"), help="where captures go")
    parser.add_argument("--memory-limit", default="256MB", help="DuckDB memory limit of the bounded run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    nsys = find_nsys()
    report, capture_s = capture(args.out, args.steps, nsys)
    arrow, sqlite = args.out / "export.arrow", args.out / "export.sqlite"
    db = args.out / "trace.duckdb"
    ingest_cmd = [sys.executable, "-m", "itertrace.cli", "ingest", "--db", str(db)]
    nsys_cmd = [str(nsys.executable)]
    runs: list[Run] = []
    closing: dict[str, str] = {}
    for name, argv in [
        ("itertrace ingest .nsys-rep", [*ingest_cmd, str(report)]),
        (f"itertrace ingest .nsys-rep --memory-limit {args.memory_limit}",
         [*ingest_cmd, "--memory-limit", args.memory_limit, str(report)]),
        ("nsys export --type arrow", [*nsys_cmd, "export", "--type", "arrow", "-f", "true", "-q", "true",
                                      "-o", str(arrow), str(report)]),
        ("itertrace ingest .arrow", [*ingest_cmd, str(arrow)]),
        ("nsys export --type sqlite", [*nsys_cmd, "export", "--type", "sqlite", "-f", "true", "-q", "true",
                                       "-o", str(sqlite), str(report)]),
        ("nsys stats --report nvtxsum (.sqlite)", [*nsys_cmd, "stats", "--report", "nvtxsum", "--format", "csv",
                                                   "--output", "-", str(sqlite)]),
    ]:
        run, stderr = measure(name, argv)
        runs.append(run)
        found = re.search(r"itertrace: ingested .*", stderr)
        if found:
            closing[name] = found.group(0)
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        ranges, marks = con.execute("SELECT (SELECT count(*) FROM nvtx_ranges), (SELECT count(*) FROM nvtx_marks)").fetchone()
    by_name = {run.name: run for run in runs}
    sqlite_path_s = by_name["nsys export --type sqlite"].wall_s + by_name["nsys stats --report nvtxsum (.sqlite)"].wall_s
    print(f"capture: {args.steps:,} steps -> {ranges:,} NVTX ranges + {marks:,} marks; "
          f"nsys profile + import took {capture_s:.1f} s; report {report.stat().st_size / 1e6:.1f} MB")
    print(f"{'command':58} {'wall s':>8} {'peak RSS MB':>12} {'peak anon MB':>13}")
    for run in runs:
        print(f"{run.name:58} {run.wall_s:8.2f} {run.peak_rss_mb:12.0f} {run.peak_anon_mb:13.0f}")
    print(f"{'nsys export --type sqlite + nsys stats nvtxsum':58} {sqlite_path_s:8.2f}")
    for name, line in closing.items():
        print(f"{name}: {line}")
    summary = {"steps": args.steps, "nvtx_ranges": ranges, "nvtx_marks": marks, "capture_s": capture_s,
               "runs": [asdict(run) for run in runs], "closing_lines": closing}
    (args.out / "bench_ingest.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    if "--kineto" in sys.argv[1:]:  # PyTorch profiler traces instead: bench_kineto.py
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_kineto import main as kineto
        kineto([arg for arg in sys.argv[1:] if arg != "--kineto"])
    else:
        main()
