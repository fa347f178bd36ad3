"""`itertrace demo`: the whole product on its built-in defaults, from the scheduling experiments to a report.

Three scheduling experiments (worked example, stranded slot-time, fairness) run on the simulated runner (a cost model: every table says so); a
short live run of the torch engine is captured with Nsight Systems where it is installed, and so are
the overlap experiment's two torch runs of the worked example, without and with overlap, shown after
the same experiment on the simulated runner (the mechanism, on the cost model's times); every run
is ingested into its own database, queried, and gathered into self-contained HTML reports.
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path

from itertrace.errors import UserError

# The engine, DuckDB and Altair are imported when the demo runs, not when `itertrace` builds its parser.

# The live run: the worked example on the torch runner, one CPU thread (see sample_traces/README.md).
LIVE = ["run", "--runner", "torch", "--workload", "worked-example", "--capacity", "8", "--seed", "0"]
# The overlap experiment: one round, the worked example on the torch runner without and with overlap
# (about a minute here, profiled).
OVERLAP = ["run", "--runner", "torch", "--capacity", "8", "--seed", "0"]


# The reports, each comparing runs of one study: (file, title, run-name prefix).
REPORTS = (
    ("report.html", "itertrace demo: the worked example, live (torch, profiled) and simulated", "worked-example"),
    ("slot-time.html", "itertrace demo: stranded slot-time, static vs continuous (simulated)", "slot-time"),
    ("fairness.html", "itertrace demo: one long request among short ones, per policy (simulated)", "fairness"),
)


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "demo", help="the scheduling experiments, a profiled live run, queries and the HTML report, on the defaults",
        description=("Run the worked example, stranded slot-time and fairness experiments (simulated), "
                     "profile a live torch run of the worked example under nsys where it is installed, ingest every "
                     "run, query them, and write one HTML report. Prints the headline tables and the report's path."))
    d.add_argument("--out", type=Path, default=Path("out/demo"), help="folder for runs, databases and the report "
                   "(an earlier demo's is replaced once this one succeeds; default %(default)s)")
    d.add_argument("--requests", type=int, default=4000, help="slot-time requests per workload (default %(default)s)")
    d.add_argument("--no-profile", action="store_true", help="run the live torch run without nsys")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    out: Path = args.out
    if args.requests < 16:
        raise UserError(f"--requests {args.requests}: the slot-time experiment needs at least 16 (the capacity)")
    previous = None
    if out.exists():
        if not out.is_dir() or not (out / "report.html").exists() and any(out.iterdir()):
            raise UserError(f"{out}: exists and is not an earlier demo's folder; give --out a new folder")
        previous = out.with_name(f".{out.name}.previous")  # kept until this demo succeeds
        shutil.rmtree(previous, ignore_errors=True)
        out.rename(previous)
    try:
        _demo(out, args)
    except BaseException:  # a failed or interrupted demo puts the earlier one back
        shutil.rmtree(out, ignore_errors=True)
        if previous is not None:
            previous.rename(out)
        raise
    if previous is not None:
        shutil.rmtree(previous)
    return 0


def _demo(out: Path, args: argparse.Namespace) -> None:
    from itertrace.profiler import experiments
    from itertrace.profiler.session import RunSpec
    from itertrace.profiler.summary_table import format_experiment

    runs, dbs = out / "runs", out / "db"
    dbs.mkdir(parents=True)
    spec = RunSpec()
    for name, result in (
        ("worked example (simulated)", experiments.worked_example(spec, runs)),
        ("stranded slot-time (simulated)", experiments.slot_time(spec, args.requests, runs)),
        ("fairness (simulated)", experiments.fairness(spec, out=runs)),
    ):
        print(f"== {name} ==\n{format_experiment(result)}\n", flush=True)

    overlap_dbs = _overlap(out / "overlap", profile=not args.no_profile)
    live = _live_run(out / "live", profile=not args.no_profile)
    dbs_by_run = {run_dir.name: _ingest(run_dir, dbs)
                  for run_dir in sorted(runs.iterdir()) if (run_dir / "run.json").is_file()}
    print(_live_summary(live))

    from itertrace.dashboards import build_report, write_report  # Altair loads only here
    reports = []
    for file_name, title, names in REPORTS:
        paths, labels = zip(*[(dbs_by_run[n], n) for n in sorted(dbs_by_run) if n.startswith(names)])
        if file_name == "report.html":
            paths, labels = (live, *paths), ("live torch run", *labels)
        written = write_report(build_report(list(paths), list(labels), title=title), out / file_name)
        reports.append(written.html.resolve())
    written = write_report(build_report(overlap_dbs, ["overlap off", "overlap on"], title=OVERLAP_TITLE),
                           out / "overlap.html")
    reports.append(written.html.resolve())
    print(f"\nreport: {reports[0]}\n  also: " + "\n        ".join(str(r) for r in reports[1:]))
    print(f"databases: {dbs.resolve()}/*.duckdb, {live.resolve()} and {(out / 'overlap').resolve()}/*\n"
          f"  e.g. itertrace query host_gaps_by_phase --db {live}")


OVERLAP_TITLE = "itertrace demo: the worked example without and with overlap (torch)"


def _overlap(folder: Path, *, profile: bool) -> list[Path]:
    """The overlap experiment, one round on the simulated runner (the mechanism, exact) and one on the torch runner
    (what this machine does), their tables printed; the torch runs' databases."""
    from itertrace.cli import build_parser
    from itertrace.profiler.cli import spec_from_args
    from itertrace.experiments.overlap import overlap
    from itertrace.profiler.summary_table import format_experiment

    mechanism = overlap(spec_from_args(build_parser().parse_args(["run"])), 1)
    print(f"== overlap off and on (simulated: the mechanism, on the cost model's times) ==\n"
          f"{format_experiment(mechanism)}\n", flush=True)
    result = overlap(spec_from_args(build_parser().parse_args(OVERLAP)), 1, folder, profile=profile)
    how = "profiled with nsys" if result["source"] == "nsys capture" else "from the run logs, not profiled"
    print(f"== overlap off and on (torch runner, {how}: measured on this machine's cores; see the split and "
          f"docs/overlap.md) ==\n{format_experiment(result)}\n", flush=True)
    return [Path(r["db"]) if r["db"] else _ingest(folder / r["name"] / "run", folder, r["name"])
            for r in sorted(result["runs"], key=lambda r: r["overlap"])]


def _ingest(run_dir: Path, dbs: Path, name: str | None = None) -> Path:
    from itertrace.ingest import ingest

    db = dbs / f"{name or run_dir.name}.duckdb"
    ingest([run_dir], db)
    return db


def _live_run(folder: Path, *, profile: bool) -> Path:
    """The live torch run: profiled under nsys where installed; its database."""
    from itertrace.ingest.nsys import find_nsys
    from itertrace.ingest.profile import profile_command

    command = [sys.executable, "-m", "itertrace.cli", *LIVE]
    if profile:
        try:
            find_nsys(None)
        except UserError:
            print("== live torch run: nsys is not installed, so the run is not profiled (scripts/setup.sh "
                  "installs it) ==", flush=True)
        else:
            print("== live torch run, profiled with nsys ==", flush=True)
            return profile_command(command, folder, echo=io.StringIO()).db
    from itertrace.cli import main
    if main([*LIVE, "--out", str(folder / "run"), "--format", "json"]) != 0:
        raise UserError("the live torch run failed")
    return _ingest(folder / "run", folder)


def _live_summary(db: Path) -> str:
    """The headline of the live run: its latency and, from the trace, where the gaps went."""
    from itertrace.queries import QueryDB

    with QueryDB(db) as q:
        tables = q.tables()
        lines = [f"== live torch run: {db} =="]
        meta = q.sql("SELECT iterations, requests FROM run_meta").to_pylist()[0]
        lat = q.sql("""SELECT median(ttft_ns) / 1e6 AS ttft, median(tpot_ns) / 1e6 AS tpot
                       FROM request_latency_log""").to_pylist()[0]
        lines.append(f"{meta['requests']} requests, {meta['iterations']} iterations; "
                     f"TTFT p50 {lat['ttft']:.1f} ms, TPOT p50 {lat['tpot']:.2f} ms")
        if "nvtx_ranges" in tables and q.sql("SELECT count(*) AS n FROM iterations").to_pylist()[0]["n"]:
            gap = q.query("host_gaps_summary").to_pylist()[0]
            lines.append(f"host gaps: {gap['gaps']} gaps, {gap['gap_share']:.1%} of the device's wall time, "
                         f"p50 {gap['gap_p50_ns'] / 1e3:.0f} us, p99 {gap['gap_p99_ns'] / 1e3:.0f} us")
            lines.append(f"  {'phase':<13}{'share of gaps':>14}{'p50 per gap':>14}")
            for row in q.query("host_gaps_by_phase").to_pylist():
                lines.append(f"  {row['phase']:<13}{row['share']:>14.1%}{row['p50_ns'] / 1e3:>11.0f} us")
            agree = q.sql("SELECT max(abs(ttft_diff_ns)) AS ttft, max(abs(tpot_diff_ns)) AS tpot "
                          "FROM request_latency_compare").to_pylist()[0]
            lines.append(f"latency rebuilt from the trace alone agrees with the log: TTFT within "
                         f"{agree['ttft'] / 1e3:.0f} us, TPOT within {agree['tpot'] / 1e3:.2f} us")
    return "\n".join(lines)
