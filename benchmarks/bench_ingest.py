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

Figures (2 cores shared with other work, whose load moves wall times up to 2x between runs of one
command: compare within one run of this script; CPU s moves less):
- rounds 1-2 (tables read where they lie, each nsys value stored once, 64 KiB blocks; the nesting in
  numpy, GPU ops and API calls numbered once): the .arrow ingest went from 3.25 s / 728 MB to 0.7-1.2x
  the SQLite path's time at 580-640 MB; the GPU-shaped capture from 3,537 MB peak RSS to 932-977 MB at
  0.2-0.3M rows/s (15-21% less CPU); the 1M-range database from 37.0 to 18 MB, the sample captures'
  from about 17 MB to 1.7 MB.
- round 3 (the GPU projection by a walk up the nesting, `ingest/projection.py`; Arrow sources scanned
  in batches so that both cores read them; pandas no longer imported, 0.36 s):
  before (this script, one run of each command, load 0.1 -> 2.6): SQLite path 9.67 s (export 6.26 +
  nvtxsum 3.41); Arrow export 4.15 s; ingest .arrow 6.00 s, 658 MB (1.61x); ingest .nsys-rep 7.58 s
  (1.83x the export); GPU-shaped 56.4 s (178,000 rows/s), 977 MB; with 256MB 142.0 s, 750 MB.
  after (2 runs of each command in turn, fastest shown, load 0.0 -> 1.9): SQLite path 5.87 s (export
  3.79 + nvtxsum 2.08); Arrow export 2.30 s; ingest .arrow 4.04 s, 636 MB (1.45x; the machine ran 40%
  faster than before, nsys's commands with it); ingest .nsys-rep 6.07 s (2.64x the export), 256MB 6.68
  s, 526 MB; database 18.0 MB (1.08x). GPU-shaped 37.4 s (268,000 rows/s), 992 MB; 256MB 100.7 s, 765
  MB. sample_traces 3.75x and 4.13x their reports.
  The projection alone on the GPU-shaped capture (in process, one run each): the interval join 7.4-8.9 s
  wall (13.6-16.0 CPU s); after, 0.4 s for the launches table, 3.7 s for the walk (1.6 s of it numpy, 765,672
  calls) and 0.75-0.9 s for the final insert.
  Old and new code in turn on that capture, one run each: 83.9 against 66.6 CPU s (52.2 / 41.2 s wall),
  1,010 against 1,023 MB peak RSS (MB as this script counts them, KiB / 1024). Tried and dropped: the nesting joined by position (POSITIONAL JOIN)
  ran out of memory at 2GB on Parquet sources; the nesting as one Arrow relation by raw row instead of
  a temp table cost the same CPU and held more memory outside DuckDB's limit.
- round 4 (DuckDB 1.2 storage, ZSTD only for text slots past 16 KiB, booleans in the shared small table,
  small tables numbered smallest first; a 64 MB bulk-free flush threshold): one run before the flush
  threshold and one after, 2 rounds each, fastest shown (the machine ran about 2x faster than in round
  3, nsys's commands with it). SQLite path 3.01 / 3.26 s; ingest .arrow 2.04 / 2.09 s (1.47x / 1.56x);
  .nsys-rep 2.82x / 3.03x the export; GPU-shaped 20.6 / 21.5 s (487,000 / 467,000 rows/s), 1,023 / 926
  MB; 256MB 42.4 / 36.9 s, 775 / 760 MB. Sample databases 1.72 / 1.65 MB before round 4, 1.19 / 1.13
  MB after (2.67x / 2.56x their reports). DuckDB 1.0 against 1.2 storage on the GPU-shaped capture, in
  turn, 2 runs each: 35.5, 37.8 against 38.3, 34.9 CPU s, 299 against 298 MB: no difference. The flush
  threshold alone (/usr/bin/time, 3 runs each): 1,020-1,025 MB peak at DuckDB's default (512 MiB),
  919-921 MB at 64 MB, the same wall time.
- round 5 (nvtx_ranges and nvtx_marks as views over 18 and 14 stored columns; a capture's small tables
  folded into one, `ingest/fold.py`). Old and new code in turn on the same exports, whole `itertrace
  ingest` processes, once after the views and once after the fold: 1M-range .arrow, 6 runs each (2
  sessions of 3): 2.71-3.56 s, 4.22-5.32 CPU s against 2.37-3.14 s, 3.47-4.42 CPU s, databases 17.6-17.8
  against 14.3-14.6 MB; GPU-shaped, 4 runs each (2 sessions of 2): 27.6-34.3 s, 47.0-54.0 CPU s against
  21.4-30.7 s, 35.5-46.2 CPU s, peak RSS 915-923 MB against 916-923 MB, databases 298.5-298.9 against
  255.7-256.4 MB. In process, one run of each, the statement writing the GPU-shaped capture's 6.1M
  ranges (the nesting apart) went from 14.2 to 5.3 s wall, 18 columns written instead of 26. This
  script, twice (2 rounds each, fastest shown; load 0.3 -> 1.8 and 0.4 -> 2.3): SQLite path 5.02 / 5.08
  s; ingest .arrow 3.06 / 3.18 s (1.64x / 1.60x); .nsys-rep 2.58x / 2.64x the export (1.80 / 1.79 s);
  GPU-shaped 21.8 / 26.3 s (459,000 / 382,000 rows/s), 910 / 918 MB; 256MB 43.4 / 54.1 s, 759 / 756 MB.
  Sample databases 1.13 MB (17 blocks) before the fold, 864,256 bytes (13 blocks) after: 1.97x and 1.93x
  their reports. Reading through the views costs queries little: on the 1M-range database,
  host_gaps_parts 0.99-1.19 s against 1.12-1.13 s from the tables, iterations 0.12-0.18 against 0.15 s
  (2 runs each). cuda_api as a view over 9 stored columns, old and new code in turn on the GPU-shaped
  capture, 4 runs each: 23.9-30.9 s, 40.2-45.6 CPU s against 21.5-24.9 s, 35.9-40.8 CPU s; databases
  256.1-256.4 against 241.3-242.0 MB.
- round 6 (nsys's held tables keep each raw row's position, which the normalized hidden tables store as
  export_row, instead of the normalized row's id: no join per link; gpu_ops a view over 15 stored
  columns; gpu_ops and cuda_api written in the export's order; the ranges numbered and nested together
  in numpy, in pieces of about 1M by start (`ingest/nesting.py`); pieces inserted as relations, not
  registered views, which the ingest's one transaction kept with their Arrow tables until it ended). Old
  and new code in turn, whole ingests, step by step: the held tables' positions, GPU-shaped 2 runs each,
  22.2 / 24.9 s (36.8 / 40.4 CPU s) against 21.1 / 20.7 s (33.9 / 33.3), database 241.4 against 228.9
  MB; 1M-range .arrow, 3 runs each, 2.37-2.68 s (3.41-3.80 CPU s) against 1.96-2.44 s (2.93-3.48),
  database 14.0 against 10.4 MB. The numbering in numpy with the relations, GPU-shaped 3 runs each:
  18.4-20.9 s (29.9-32.8 CPU s), 917-936 MB against 16.5-17.8 s (25.9-28.3), 720-764 MB; nvtx_ranges,
  nvtx_marks, nvtx_gpu_projection, gpu_ops, cuda_api, nsys.NVTX_EVENTS and
  nsys.CUPTI_ACTIVITY_KIND_KERNEL hash the same. This script, twice (2 rounds each, fastest shown; load
  0.7 -> 1.9 and 1.3 -> 2.0): SQLite path 4.94 / 5.61 s; ingest .arrow 2.66 / 3.21 s (1.85x / 1.75x),
  458 / 454 MB; .nsys-rep 2.56x / 3.13x the export (1.80 / 1.75 s); database 10.4 MB (0.64x the report);
  GPU-shaped 17.6 / 17.4 s (570,000 / 575,000 rows/s), 694 / 706 MB; 256MB 34.7 / 58.7 s, 539 / 517 MB.
  Sample databases unchanged (1.97x and 1.93x).
- round 7 (the ranges numbered and nested in a thread on a second connection while the ingest's
  connection builds nvtx_marks, cuda_api and gpu_ops, `ingest/background.py`). Old and new code in turn,
  whole ingests: 1M-range .arrow, 5 runs each, 2.67-3.00 s (3.72-4.00 CPU s), 469-488 MB against
  2.26-2.62 s (3.45-3.82), 523-562 MB; GPU-shaped, 3 runs each, 17.1-19.2 s (27.4-30.0 CPU s), 685-712 MB
  against 17.2-17.6 s (29.1-30.4), 769-793 MB: there the nesting (5.3 s in its thread, one in-process
  run) ends before the ingest's connection needs it, which then has the two cores nearly all busy.
  Table contents hash the same. This script, twice (2 rounds each, fastest shown; load 1.2 -> 2.0 and
  2.0 -> 2.0): SQLite path 4.87 / 6.03 s; ingest .arrow 2.62 / 2.85 s (1.86x / 2.11x), 586 / 497 MB;
  .nsys-rep 2.31x / 2.72x the export (2.00 / 2.02 s); GPU-shaped 15.47 / 15.46 s (648,000 / 649,000
  rows/s), 823 / 765 MB; 256MB 39.7 / 53.6 s, 567 / 557 MB. Sample databases unchanged.

Why the .nsys-rep ingest costs 2.6-5x the export (rounds 1-6): it is the export, then the .arrow ingest,
nothing more (no second export, no extra tables, no wait: CPU of one .nsys-rep ingest 6.21 / 5.96 s
against 6.52 / 5.62 s for `nsys export --type arrow` plus the .arrow ingest, 2 runs in turn). The .arrow
ingest is the part over the target. Overlapping the two would not help: the export writes nothing for
~85% of its time (9.7 of 11.3 s, polling its file's size), and NVTX_EVENTS, which everything waits on,
is written at the end.

Floor (CPU s, so that the machine's load counts less; on an idle machine DuckDB runs on both cores;
round 3: writing the 1M-range nvtx_ranges from memory took 1.46-1.94 CPU s, about a third of it its four
text columns, 0.17-0.21 s each; dictionary-encoded Arrow text saved under 10%, uncompressed storage
nothing, preserve_insertion_order = false nothing):
interpreter and imports 0.35-0.38 (3 runs). Writing the normalized tables from memory into a new file,
CREATE TABLE AS (1 run each): NVTX-only nvtx_ranges 1M x 26 columns 1.15-1.26 (48 ns a value; 0.94 in
memory; 0.89 without its 9 all-NULL columns), nvtx_marks 250k x 20 0.21. GPU-shaped: nvtx_ranges 6.1M x
26 11.2, gpu_ops 1.6M x 16 2.7 (106 ns a value: long kernel names), cuda_api 2.1M x 13 1.3,
nvtx_gpu_projection 1.2M x 6 0.27: 15.5 CPU s before any of nsys's own tables.

Targets not reached (rounds 5-6 reached the size target; the memory one holds). Each is below what
this machine's two cores take to start the interpreter and write the finished database's values once,
before any reading, numbering, nesting or projection. Measured in round 7: interpreter and imports
0.32-0.73 s wall (6 runs); writing every stored table of the finished database from in-memory copies
into a new file (CREATE TABLE AS, `default_block_size` 64 KiB or 256 KiB: no difference), 1M-range
capture 0.53-0.68 s wall (1.03-1.30 CPU s, 3 runs), GPU-shaped 6.2-7.6 s wall (11.7-14.3 CPU s, 4 runs),
of which the ranges' 19 columns take 2.5-2.8 s (their text 0.8 s, each all-NULL column about 0.1 s).
- .arrow ingest >= 10x the SQLite path: 0.49-0.60 s in round 7, against 0.85-1.4 s for the imports and
  the writes alone.
- .nsys-rep ingest <= 1.5x the export: at most 1.0 s on top of the 2.0 s export, against the same
  0.85-1.4 s.
- GPU-shaped >= 2M rows/s: 5.0 s for the 10M rows, against 6.2-7.6 s for the writes alone; the whole
  ingest takes 27-30 CPU s, and its two cores are nearly all busy.
What would reach them: fewer values copied or more cores. Leaving nsys's own tables in the Parquet
export beside the database (views over read_parquet) gives up the self-contained file; text stored as
ids into a strings table (0.8 of the ranges' 2.5-2.8 s) would have every query that reads nvtx_ranges'
text join for it. The writes run on every core DuckDB has; the numpy phases (3.3 CPU s of nesting, 2.6 of
projection walk) on one each.
- Peak RSS < 1 GB: met, 765-823 MB in round 7 (the nesting's arrays beside gpu_ops' work), 694-764 MB
  in round 6 (917-936 before): each piece of the nesting went into
  DuckDB through a registered view, and the ingest's one transaction kept every dropped view with its
  Arrow table, and that table the whole fetched piece its column came from, until it committed (about
  90 MB a piece). Earlier: the numpy nesting first took the GPU-shaped ingest to 1,023-1,184 MB, fixed by
  pieces; glibc's malloc thresholds do not move the peak (MALLOC_MMAP_THRESHOLD_ and MALLOC_ARENA_MAX
  tried); round 4's 64 MB bulk-free flush threshold took it from 1,020-1,025 to 919-921 MB.
  `--memory-limit 256MB` gives 517-567 MB at 2-3.5x the time (rounds 6-7).
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
