"""`itertrace ingest SOURCE... --db FILE` and `itertrace profile [--out DIR] -- COMMAND...`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from itertrace.argtypes import at_least

# DuckDB and pyarrow are imported by the commands that use them, not to build the parser.
BATCH_ROWS = 65_536  # IngestOptions.batch_rows, written out for that reason (a test checks they agree)
STORE_CHOICES = ("auto", "always", "never")  # ingest --store: what itertrace.queries.stored keeps
STORE_AUTO_ROWS = 1_000_000  # --store auto: store on captures of at most this many rows


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `ingest` subcommand."""
    parser = subparsers.add_parser(
        "ingest",
        help="load nsys reports and exports into a DuckDB database",
        description=("Load Nsight Systems captures (.nsys-rep, an Arrow export, or an arrowdir or parquetdir "
                     "folder) and the engine's run directories into one DuckDB database: nsys's own tables in the "
                     "schema `nsys`, and documented tables such as nvtx_ranges, gpu_ops, cuda_api, "
                     "nvtx_gpu_projection and run_iterations beside them."),
    )
    parser.add_argument("sources", nargs="+", type=Path, metavar="SOURCE",
                        help="report, export file or folder, or an itertrace run directory")
    parser.add_argument("--db", required=True, type=Path, metavar="FILE", help="database to write (replaced on success)")
    parser.add_argument("--batch-rows", type=at_least(1), default=BATCH_ROWS, metavar="N",
                        help="rows per batch streamed into DuckDB (default %(default)s)")
    parser.add_argument("--memory-limit", metavar="SIZE", help="DuckDB memory limit, e.g. 2GB (default: 512MB)")
    parser.add_argument("--nsys", metavar="PATH", help="nsys executable for .nsys-rep sources (default: on PATH)")
    parser.add_argument("--store", choices=STORE_CHOICES, default="auto",
                        help="store the answer of `itertrace query gpu_time_summary` and the mapping auto chooses "
                             "in the database, so that commands read them instead of computing them (auto: on "
                             f"captures of at most {STORE_AUTO_ROWS:,} rows; see docs/ingest.md)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no closing line")
    parser.set_defaults(func=run)

    prof = subparsers.add_parser(
        "profile",
        help="run a command under nsys profile and ingest the capture with its run directory",
        usage="itertrace profile [-h] [--out DIR] [--nsys PATH] [--trace LIST] [--quiet] -- COMMAND...",
        description=("Run COMMAND under `nsys profile` (NVTX and OS runtime; CUDA as well where a GPU is present), "
                     "export and ingest the capture into DIR/trace.duckdb, together with the run directory when "
                     "COMMAND is `itertrace run` (written to DIR/run unless it names its own --out). DIR gets "
                     "report.nsys-rep, run/, trace.duckdb and profile.log; if COMMAND fails, nothing is kept. "
                     "COMMAND's output is shown as it runs."),
    )
    prof.add_argument("--out", type=Path, metavar="DIR",
                      help="folder to create, new or empty (default: runs/profile-<time>)")
    prof.add_argument("--nsys", metavar="PATH", help="nsys executable (default: on PATH)")
    prof.add_argument("--trace", metavar="LIST",
                      help="nsys --trace APIs, comma-separated (default: nvtx,osrt, plus cuda where a GPU is present)")
    prof.add_argument("--quiet", action="store_true", help="print only the database path, not COMMAND's output")
    prof.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command to profile, after --")
    prof.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    """Profile the command, ingest, and print the database path with a short summary."""
    from itertrace.ingest.profile import CommandFailed, profile_command, summary_lines

    traces = [t.strip() for t in args.trace.split(",") if t.strip()] if args.trace else None
    try:
        result = profile_command(args.command, args.out, nsys_executable=args.nsys, traces=traces,
                                 echo=None if args.quiet else sys.stdout,
                                 progress=None if args.quiet else sys.stderr)
    except CommandFailed as exc:
        print(f"itertrace: error: {exc}", file=sys.stderr)
        return exc.status if 0 < exc.status < 256 else 1
    if args.quiet:
        print(result.db)
    else:
        print("\n".join(summary_lines(result)))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the ingest and print the closing line: rows, sources, time, rows/s."""
    from itertrace.ingest.api import IngestOptions, default_loaders, ingest
    from itertrace.ingest.loader import events_line
    from itertrace.ingest.progress import Progress

    options = IngestOptions(batch_rows=args.batch_rows, memory_limit=args.memory_limit)
    progress = Progress(sys.stderr, enabled=not args.quiet)
    from itertrace.queries.stored import storing

    result = ingest(args.sources, args.db, loaders=default_loaders(args.nsys), options=options, progress=progress,
                    finish=storing(args.store))
    if not args.quiet:
        sources = f"{len(result.sources)} source{'s' if len(result.sources) != 1 else ''}"
        empty = f"; empty: {', '.join(result.empty)}" if result.empty else ""
        print(f"itertrace: ingested {result.rows:,} rows from {sources} into {result.db} in {result.seconds:.1f} s "
              f"({result.rows_per_s:,.0f} rows/s){empty}", file=sys.stderr)
        if result.event_counts:
            print(f"itertrace: {events_line(result.event_counts)}", file=sys.stderr)
    for note in result.notes:
        print(f"itertrace: note: {note}", file=sys.stderr)
    return 0
