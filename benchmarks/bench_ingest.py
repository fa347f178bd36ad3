"""Benchmark (not a test): ingest of large captures, beside nsys's own SQLite export + nvtxsum, side by side.

Two captures, each command in its own process, each run `--repeat` times in turn (the table shows the
fastest run and its peak memory; the JSON keeps every run):

- **NVTX-only**: a Python program emitting STEPS `step` push/pop ranges (payload = step number) around
  `schedule`, `forward`, `sample` ranges, plus one `arrive` mark per step, under
  `nsys profile --trace=nvtx,osrt` (250,000 steps: 1,000,000 ranges + 250,000 marks). Measured:
  `nsys export --type sqlite` + `nsys stats --report nvtxsum` on the .sqlite (the path a user has
  today), `nsys export --type arrow` alone, `itertrace ingest` of that .arrow (the DuckDB work),
  `itertrace ingest` of the .nsys-rep (export included), and the same with `--memory-limit`.
- **GPU-shaped**: the real 2x H100 export `../shared/nsys_samples/h100_2gpu_1s_pqtdir` (kernels,
  runtime API calls, memcpys, NVTX ranges from PyTorch and NCCL) repeated to at least `--gpu-rows`
  rows (`gpu_capture.py`: copy k shifted k capture-spans later in time, its correlation, grid and range
  ids shifted past copy k-1's) as a parquetdir export. It has no .nsys-rep, so no nsys commands:
  `itertrace ingest` of it with the default memory limit and with `--memory-limit`.

Ratios: the SQLite path over the .arrow ingest (target >= 10), the .nsys-rep ingest over the Arrow
export (target <= 1.5), rows/s of the GPU-shaped ingest (target >= 2,000,000), peak RSS (target < 1 GB
by default), and each database's size over its .nsys-rep's (target <= 2; also for `sample_traces/`);
the database sizes shown are those of the default-settings ingests (.arrow; parquetdir).
Wall times are the whole process (interpreter start included); `ingest s` is the ingest's own clock,
from its closing line; `CPU s` is user + system CPU of the process and its waited-for children, which a
busy machine inflates far less than wall time. Peak RSS is the process and its waited-for children
(wait4; file-backed pages of a memory-mapped Arrow export count), peak anon the process's anonymous
memory, sampled every 20 ms.

Usage: python benchmarks/bench_ingest.py [--steps N] [--gpu-rows N] [--repeat N] [--out DIR] [--json FILE]

Compare figures within one run of this script: wall times on a shared machine move with its load.
The latest figures are in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gpu_capture

from itertrace.ingest.nsys import Nsys, find_nsys, profile

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT.parent / "shared" / "nsys_samples" / "h100_2gpu_1s_pqtdir"
SAMPLES = ROOT / "sample_traces"
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
_CLOSING = re.compile(r"itertrace: ingested ([\d,]+) rows .* in ([\d.]+) s \(([\d,]+) rows/s\)")


@dataclass(frozen=True)
class Run:
    """One measured command."""

    name: str
    wall_s: float
    peak_rss_mb: float  # the process and its waited-for children
    peak_anon_mb: float  # the process itself, sampled
    cpu_s: float  # user + system CPU of the process and its waited-for children: less hostage to a busy machine
    ingest_s: float | None = None  # the ingest's own clock (its closing line)
    rows: int | None = None


def measure(name: str, argv: list[str]) -> Run:
    """Run `argv` to completion and measure it."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        peak_anon = _sample_anon(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{name} failed (exit {code}): {stderr.strip()[-500:]}")
    found = _CLOSING.search(stderr)
    ingest_s, rows = (float(found.group(2)), int(found.group(1).replace(",", ""))) if found else (None, None)
    return Run(name, wall, usage.ru_maxrss / 1024, peak_anon() / 1024, usage.ru_utime + usage.ru_stime, ingest_s, rows)


def _sample_anon(pid: int):
    peak = [0]

    def sample() -> None:
        while True:
            try:
                with open(f"/proc/{pid}/status") as status:
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


def nvtx_capture(out: Path, steps: int, nsys: Nsys) -> Path:
    """The report of STEPS steps (made once, reused after)."""
    report = out / f"nvtx_{steps}.nsys-rep"
    if not report.is_file():
        program = out / "emit_nvtx.py"
        program.write_text(PROGRAM)
        done = profile([sys.executable, str(program), str(steps)], report, nsys, traces=("nvtx", "osrt"),
                       log=out / "nsys-profile.log")
        if done.returncode != 0:
            raise SystemExit(f"the profiled program failed; see {out / 'nsys-profile.log'}")
    return report


def gpu_export(out: Path, rows: int) -> tuple[Path, int]:
    """The GPU-shaped parquetdir export of at least `rows` rows (made once, reused after), and its copies."""
    tables = gpu_capture.source_tables(H100)
    copies = gpu_capture.copies_for(tables, rows)
    folder = out / f"gpu_{copies}x_pqtdir"
    if not folder.is_dir():
        partial = out / f".{folder.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        gpu_capture.write_capture(tables, copies, partial)
        partial.rename(folder)
    return folder, copies


def in_turn(commands: list[tuple[str, list[str]]], repeat: int) -> dict[str, list[Run]]:
    """Every command `repeat` times, round by round, so that a slow spell of the machine hits all alike."""
    runs: dict[str, list[Run]] = {name: [] for name, _ in commands}
    for _ in range(repeat):
        for name, argv in commands:
            runs[name].append(measure(name, argv))
    return runs


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda run: run.wall_s)


def size_mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def nvtx_benchmark(args: argparse.Namespace, nsys: Nsys) -> dict:
    """The NVTX-only capture's table: nsys's SQLite path, the Arrow export, and the ingests."""
    out = args.out
    report = nvtx_capture(out, args.steps, nsys)
    arrow, sqlite, db = out / "export.arrow", out / "export.sqlite", out / "nvtx.duckdb"
    ingest = [sys.executable, "-m", "itertrace.cli", "ingest", "--db", str(db)]
    other = [sys.executable, "-m", "itertrace.cli", "ingest", "--db", str(out / "nvtx-other.duckdb")]
    exe = str(nsys.executable)
    runs = in_turn([
        ("nsys export --type sqlite", [exe, "export", "--type", "sqlite", "-f", "true", "-q", "true",
                                       "-o", str(sqlite), str(report)]),
        ("nsys stats --report nvtxsum", [exe, "stats", "--report", "nvtxsum", "--format", "csv", "--output", "-",
                                         str(sqlite)]),
        ("nsys export --type arrow", [exe, "export", "--type", "arrow", "-f", "true", "-q", "true",
                                      "-o", str(arrow), str(report)]),
        ("itertrace ingest .arrow", [*ingest, str(arrow)]),
        ("itertrace ingest .nsys-rep", [*other, str(report)]),
        (f"itertrace ingest .nsys-rep --memory-limit {args.memory_limit}",
         [*other, "--memory-limit", args.memory_limit, str(report)]),
    ], args.repeat)
    shown = {name: best(found) for name, found in runs.items()}
    sqlite_path = shown["nsys export --type sqlite"].wall_s + shown["nsys stats --report nvtxsum"].wall_s
    ratios = {
        "sqlite_path_over_arrow_ingest": sqlite_path / shown["itertrace ingest .arrow"].wall_s,
        "nsys_rep_ingest_over_arrow_export": shown["itertrace ingest .nsys-rep"].wall_s / shown["nsys export --type arrow"].wall_s,
        "database_over_report": size_mb(db) / size_mb(report),
    }
    return {"capture": f"{args.steps:,} steps", "report_mb": size_mb(report), "database_mb": size_mb(db),
            "sqlite_path_s": sqlite_path, "ratios": ratios,
            "runs": {name: [asdict(run) for run in found] for name, found in runs.items()}, "shown": shown}


def gpu_benchmark(args: argparse.Namespace) -> dict:
    """The GPU-shaped capture's table: its ingest with the default and a given memory limit."""
    folder, copies = gpu_export(args.out, args.gpu_rows)
    db = args.out / "gpu.duckdb"
    ingest = [sys.executable, "-m", "itertrace.cli", "ingest", "--db", str(db)]
    bounded = [sys.executable, "-m", "itertrace.cli", "ingest", "--db", str(args.out / "gpu-bounded.duckdb")]
    runs = in_turn([
        ("itertrace ingest parquetdir", [*ingest, str(folder)]),
        (f"itertrace ingest parquetdir --memory-limit {args.gpu_memory_limit}",
         [*bounded, "--memory-limit", args.gpu_memory_limit, str(folder)]),
    ], args.repeat)
    shown = {name: best(found) for name, found in runs.items()}
    first = shown["itertrace ingest parquetdir"]
    ratios = {"rows_per_s_wall": first.rows / first.wall_s, "rows_per_s_ingest": first.rows / first.ingest_s}
    return {"capture": f"h100_2gpu_1s_pqtdir x {copies}", "rows": first.rows, "export_mb": _folder_mb(folder),
            "database_mb": size_mb(db), "ratios": ratios,
            "runs": {name: [asdict(run) for run in found] for name, found in runs.items()}, "shown": shown}


def sample_sizes(out: Path) -> list[dict]:
    """Each sample trace's database (its capture alone, and with its run directory) against its report."""
    sizes = []
    for folder in sorted(SAMPLES.glob("worked-example-*")):
        report = folder / "report.nsys-rep"
        row = {"sample": folder.name, "report_mb": size_mb(report)}
        for label, sources in (("capture", [report]), ("with_run", [folder / "run", report])):
            db = out / f"{folder.name}-{label}.duckdb"
            subprocess.run([sys.executable, "-m", "itertrace.cli", "ingest", "--quiet", "--db", str(db),
                            *map(str, sources)], check=True)
            row[f"{label}_mb"] = size_mb(db)
        sizes.append(row)
    return sizes


def _folder_mb(folder: Path) -> float:
    return sum(file.stat().st_size for file in folder.iterdir()) / 1e6


def print_table(title: str, shown: dict[str, Run]) -> None:
    print(title)
    print(f"| {'command':56} | {'wall s':>7} | {'CPU s':>7} | {'ingest s':>8} | {'peak RSS MB':>11} | "
          f"{'peak anon MB':>12} |")
    print(f"| {'-' * 56} | {'-' * 7} | {'-' * 7} | {'-' * 8} | {'-' * 11} | {'-' * 12} |")
    for run in shown.values():
        ingest_s = f"{run.ingest_s:8.2f}" if run.ingest_s is not None else " " * 8
        print(f"| {run.name:56} | {run.wall_s:7.2f} | {run.cpu_s:7.2f} | {ingest_s} | {run.peak_rss_mb:11.0f} | "
              f"{run.peak_anon_mb:12.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250_000, help="NVTX-only capture: steps, 4 ranges and 1 mark each")
    parser.add_argument("--gpu-rows", type=int, default=10_000_000, help="GPU-shaped capture: at least this many rows")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each command, in turn (default 2)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench"), help="where captures go")
    parser.add_argument("--memory-limit", default="256MB", help="DuckDB memory limit of the NVTX-only bounded run")
    parser.add_argument("--gpu-memory-limit", default="256MB", help="DuckDB memory limit of the GPU-shaped bounded run")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--skip", choices=("nvtx", "gpu", "samples"), action="append", default=[],
                        help="leave a part out (repeatable)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    summary: dict = {"load_average": load, "repeat": args.repeat}
    if "nvtx" not in args.skip:
        nvtx = nvtx_benchmark(args, find_nsys())
        print_table(f"NVTX-only capture ({nvtx['capture']}; report {nvtx['report_mb']:.1f} MB, database "
                    f"{nvtx['database_mb']:.1f} MB)", nvtx["shown"])
        r = nvtx["ratios"]
        print(f"nsys SQLite path (export + nvtxsum) {nvtx['sqlite_path_s']:.2f} s = "
              f"{r['sqlite_path_over_arrow_ingest']:.2f}x the .arrow ingest (target >= 10); "
              f".nsys-rep ingest = {r['nsys_rep_ingest_over_arrow_export']:.2f}x the Arrow export (target <= 1.5); "
              f"database = {r['database_over_report']:.2f}x the report (target <= 2)")
        summary["nvtx"] = {key: value for key, value in nvtx.items() if key != "shown"}
    if "gpu" not in args.skip:
        gpu = gpu_benchmark(args)
        print_table(f"GPU-shaped capture ({gpu['capture']}: {gpu['rows']:,} rows, parquetdir {gpu['export_mb']:.0f} MB, "
                    f"database {gpu['database_mb']:.0f} MB)", gpu["shown"])
        r = gpu["ratios"]
        print(f"{r['rows_per_s_wall']:,.0f} rows/s for the whole process, {r['rows_per_s_ingest']:,.0f} rows/s by the "
              "ingest's own clock (target >= 2,000,000)")
        summary["gpu"] = {key: value for key, value in gpu.items() if key != "shown"}
    if "samples" not in args.skip:
        sizes = sample_sizes(args.out)
        for row in sizes:
            print(f"{row['sample']}: report {row['report_mb']:.2f} MB, database {row['capture_mb']:.2f} MB "
                  f"({row['capture_mb'] / row['report_mb']:.2f}x; target <= 2), with its run directory "
                  f"{row['with_run_mb']:.2f} MB ({row['with_run_mb'] / row['report_mb']:.2f}x)")
        summary["sample_traces"] = sizes
    summary["load_average_after"] = os.getloadavg()
    print(f"load average {load[0]:.2f} before, {summary['load_average_after'][0]:.2f} after")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    if "--kineto" in sys.argv[1:]:  # PyTorch profiler traces instead: bench_kineto.py
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_kineto import main as kineto
        kineto([arg for arg in sys.argv[1:] if arg != "--kineto"])
    else:
        main()
