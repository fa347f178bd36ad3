"""`itertrace report --fleet FLEET -o fleet.html`: the fleet's page, and each capture's report as a task."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from itertrace.argtypes import at_least
from itertrace.errors import UserError


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    """The report command's options for a fleet's page."""
    fleet = parser.add_argument_group("a fleet's page (instead of --db)")
    fleet.add_argument("--fleet", type=Path, metavar="FLEET",
                       help="write the page of a fleet (`itertrace fleet summary` first), linking each capture's "
                            "report in FLEET/reports/, made where missing or older than its database")
    fleet.add_argument("--no-capture-reports", action="store_true",
                       help="with --fleet: make no capture's report (the page links those that exist)")
    where = fleet.add_mutually_exclusive_group()
    where.add_argument("--workers", type=at_least(1), metavar="N",
                       help="with --fleet: local worker processes for the captures' reports (default: one per core)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="with --fleet: an existing Dask scheduler for the captures' reports, tcp://HOST:PORT")


def run_fleet_report(args: argparse.Namespace, started: float) -> int:
    """Write the captures' reports that are missing, then the fleet's page; one closing line."""
    if args.fleet is None:
        raise UserError("report: give --db FILE (a run's database), or --fleet FLEET (a fleet's page)")
    if args.db:
        raise UserError("report: give --db or --fleet, not both")
    if args.label:
        raise UserError("report: --label names the runs of --db; a fleet's captures are named by their paths")
    from itertrace.dashboards.fleet_report import (ReportOutcome, build_fleet_report, check_summary, report_jobs,
                                                   write_capture_report)
    from itertrace.dashboards.html import write_report_or_fail
    from itertrace.fleet.cluster import ClusterOptions, check_answers, fleet_client
    from itertrace.fleet.layout import existing, held, read_manifest
    from itertrace.fleet.runner import TaskProgress, run_tasks
    from itertrace.targets import Kind, remove_leftovers, replaceable

    from itertrace.queries.cli import parse_params

    params = tuple(sorted(parse_params(args.param).items()))
    options = ClusterOptions(scheduler=args.scheduler, workers=args.workers)
    if options.scheduler:
        check_answers(options.scheduler)
    fleet = existing(args.fleet)
    check_summary(fleet)
    out = replaceable(args.out, Kind.REPORT, "-o")
    remove_leftovers(out)
    failed: list[tuple[str, str]] = []
    with held(fleet):
        done = sorted(e.capture for e in read_manifest(fleet).values()
                      if e.status == "done" and fleet.database(e.capture).is_file())
        jobs = [] if args.no_capture_reports else report_jobs(fleet, done, params)
        if jobs:
            progress = TaskProgress("capture reports", len(jobs), enabled=not args.quiet)
            progress.start()
            with fleet_client(options, fleet.root, ()) as client:
                for job, outcome in run_tasks(client, write_capture_report, jobs,
                                              lambda j, line: ReportOutcome(j.name, line)):
                    if outcome.error:
                        failed.append((job.name, outcome.error))
                    progress.count(failed=outcome.error is not None)
            progress.close()
        report = build_fleet_report(fleet, out, title=args.title)
    written = write_report_or_fail(report, out, args.png)
    if not args.quiet:
        for name, error in failed:
            print(f"itertrace: report of {name} failed: {error}", file=sys.stderr)
        made = f", {len(jobs) - len(failed):,} capture reports made in {fleet.report('').parent}" if jobs else ""
        print(f"itertrace: wrote {written.html} ({written.charts} charts, {written.tables} tables{made}) in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0

