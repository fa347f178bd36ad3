"""`itertrace report --db FILE [--db FILE ...] [--label NAME ...] -o report.html [--png DIR]`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from itertrace.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand (and `export`, from perfetto_cli)."""
    from itertrace.dashboards import perfetto_cli
    from itertrace.queries.cli import add_memory_limit

    perfetto_cli.register(subparsers)
    parser = subparsers.add_parser(
        "report",
        help="write one self-contained HTML page of a run's (or several runs') charts and tables",
        description=("Write one HTML page with the charts and key tables of a run, or of a comparison of runs: "
                     "host gaps by phase and the iteration timeline (when the database holds an nsys trace), batch "
                     "membership, slot-time, active tokens, latency CDFs, fairness, and whether log and trace "
                     "agree (when it holds both). The page inlines its JavaScript and needs no network. Sections a "
                     "database cannot fill are replaced by a note."),
    )
    parser.add_argument("--db", action="append", type=Path, metavar="FILE",
                        help="database made by `itertrace ingest`; repeat to compare runs")
    parser.add_argument("--label", action="append", metavar="NAME",
                        help="name of each --db's run, in the same order (default: what differs between the runs)")
    parser.add_argument("-o", "--out", required=True, type=Path, metavar="FILE", help="HTML file to write (replaced)")
    parser.add_argument("--png", type=Path, metavar="DIR", help="also write each chart as a PNG into this folder")
    parser.add_argument("--title", metavar="TEXT", help="page title (default: itertrace report: LABELS)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a query parameter for every database, e.g. preset=generic and "
                             "step_pattern='^decode_step_\\d+$' for another program's trace (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_memory_limit(parser)
    from itertrace.dashboards.fleet_cli import add_fleet_options

    add_fleet_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the report, write it, and print one closing line."""
    from itertrace.dashboards.html import write_report_or_fail  # altair and vl-convert load only for this command
    from itertrace.dashboards.report import build_report

    started = time.perf_counter()
    if args.fleet is not None or not args.db:
        from itertrace.dashboards.fleet_cli import run_fleet_report

        return run_fleet_report(args, started)
    from itertrace.queries.cli import parse_params

    from itertrace.targets import Kind, remove_leftovers, replaceable

    if any(args.out.resolve() == db.resolve() for db in args.db):
        raise UserError(f"-o {args.out}: is one of the --db databases; write the report to another file")
    out = replaceable(args.out, Kind.REPORT, "-o")  # before the seconds a report takes
    remove_leftovers(out)
    report = build_report(args.db, args.label, title=args.title, params=parse_params(args.param),
                          memory_limit=args.memory_limit)
    written = write_report_or_fail(report, out, args.png)
    if not args.quiet:
        pngs = f", {len(written.pngs)} PNGs in {args.png}" if written.pngs else ""
        print(f"itertrace: wrote {written.html} ({written.charts} charts, {written.tables} tables, "
              f"{written.bytes / 1e6:.1f} MB{pngs}) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0
