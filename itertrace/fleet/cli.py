"""`itertrace fleet ingest CAPTURE_OR_DIR... --out FLEET` and `itertrace fleet summary FLEET`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from itertrace.argtypes import at_least
from itertrace.errors import UserError

# Dask, DuckDB and pyarrow are imported by the commands, not to build the parser.
_SHOWN_FAILURES = 5


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `fleet` subcommand and its actions."""
    fleet = subparsers.add_parser(
        "fleet", help="many captures (a trace per rank, a report per node) as tasks on Dask; ranks compared",
        description=("Ingest and summarize many captures at once, a task per capture on Dask's distributed scheduler: "
                     "a local cluster of a worker per core, or an existing cluster (--scheduler), whose workers must "
                     "see the captures and the fleet's folder at the same paths (a shared file system). See "
                     "docs/fleet.md."))
    actions = fleet.add_subparsers(dest="action", metavar="ACTION", parser_class=type(fleet))
    actions.required = True

    ingest = actions.add_parser(
        "ingest", help="make each capture's database under FLEET, a task each",
        description=("Make each capture's database under FLEET/captures/ exactly as `itertrace ingest` does, a task "
                     "per capture. A folder given is searched for captures (PyTorch profiler traces, Nsight Systems "
                     "reports and exports), each named by its path from that folder; a capture goes in with the run "
                     "directory beside it. A capture that fails is listed in FLEET/failures.parquet with its error "
                     "and the rest go on; the command fails only if all fail. A second run skips the captures done."))
    ingest.add_argument("paths", nargs="+", type=Path, metavar="CAPTURE_OR_DIR", help="a capture, or a folder of them")
    ingest.add_argument("--out", required=True, type=Path, metavar="FLEET",
                        help="the fleet's folder: new, empty, or a fleet to add to")
    ingest.add_argument("--rank-from", metavar="REGEX",
                        help="read each capture's rank from its path: the regex's one group, e.g. 'rank-(\\d+)' "
                             "(default: from the capture: distributedInfo, NCCL ranges, device ids)")
    ingest.add_argument("--group-from", metavar="REGEX",
                        help="read the group of ranks compared together from the path: the regex's one group "
                             "(default: the folder holding the capture)")
    ingest.add_argument("--memory-limit", metavar="SIZE", help="DuckDB memory limit of each ingest (default: 512MB)")
    ingest.add_argument("--nsys", metavar="PATH", help="nsys executable on the workers, for .nsys-rep captures")
    _cluster(ingest)
    ingest.set_defaults(func=run_ingest)

    summary = actions.add_parser(
        "summary", help="per-capture queries as tasks, reduced by DuckDB into FLEET/summary",
        description=("Query each capture's database (read-only, as `itertrace query` opens it), a task per capture, "
                     "and reduce the results with DuckDB into Hive-partitioned Parquet under FLEET/summary/, with "
                     "FLEET/summary/fleet.duckdb holding a view of each table: fleet_ranks (per capture, rank and "
                     "GPU), fleet_iterations, fleet_groups, fleet_skew (per group and iteration: each rank's time, "
                     "the skew, the straggler), fleet_stragglers, fleet_captures, fleet_failures."))
    summary.add_argument("fleet", type=Path, metavar="FLEET", help="the fleet's folder (made by `fleet ingest`)")
    summary.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                         help="a query parameter for every capture, e.g. preset=vllm (repeatable)")
    summary.add_argument("--memory-limit", metavar="SIZE", help="DuckDB memory limit of each capture's queries")
    _cluster(summary)
    summary.set_defaults(func=run_summary)


def _cluster(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=at_least(1), metavar="N",
                       help="worker processes of the local cluster (default: one per core)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="an existing Dask scheduler, tcp://HOST:PORT; its workers must see the captures and "
                            "FLEET at the same paths as this machine")
    parser.add_argument("--threads", type=at_least(1), metavar="N",
                        help="DuckDB threads in each task (default: the cores per local worker; 1 on --scheduler)")
    parser.add_argument("--quiet", action="store_true", help="no progress line and no closing line")


def _options(args: argparse.Namespace):
    from itertrace.fleet.cluster import ClusterOptions

    return ClusterOptions(scheduler=args.scheduler, workers=args.workers, threads=args.threads)


def run_ingest(args: argparse.Namespace) -> int:
    """Find the captures, ingest those not done, print the closing line; status 1 if every one failed."""
    from itertrace.fleet.captures import PathRules, find_captures
    from itertrace.fleet.cluster import check_answers, fleet_client
    from itertrace.fleet.ingest_tasks import IngestSettings, ingest_fleet
    from itertrace.fleet.layout import held, new_or_existing, read_manifest
    from itertrace.fleet.runner import TaskProgress

    rules = PathRules(args.rank_from, args.group_from)
    rules.check()
    options = _options(args)
    if options.scheduler:
        check_answers(options.scheduler)  # before the captures are looked for: a dead address is refused at once
    captures = find_captures(args.paths, skip=args.out)
    for capture in captures:
        rules.rank(capture)  # a rank that is no integer is refused before anything runs
    fleet = new_or_existing(args.out)
    with held(fleet):
        settings = IngestSettings(args.memory_limit, args.nsys, options.task_threads())
        progress = TaskProgress("fleet ingest", 0, enabled=not args.quiet)
        with fleet_client(options, fleet.root, tuple(c.source for c in captures)) as client:
            result = ingest_fleet(captures, fleet, client, rules=rules, settings=settings, progress=progress)
        failures = [e for e in read_manifest(fleet).values() if e.status == "failed" and
                    e.capture in {c.name for c in captures}]
    if not args.quiet:
        for entry in failures[:_SHOWN_FAILURES]:
            print(f"itertrace: failed: {entry.capture}: {entry.error}", file=sys.stderr)
        if len(failures) > _SHOWN_FAILURES:
            print(f"itertrace: ... and {len(failures) - _SHOWN_FAILURES} more failures", file=sys.stderr)
    if result.failed and result.failed == result.total:
        print(f"itertrace: fleet ingest: all {result.total:,} captures failed ({fleet.failures} lists each with its "
              "error)", file=sys.stderr)
        return 1
    if not args.quiet:
        rate = f", {result.ingested / result.seconds:.2f} captures/s" if result.ingested and result.seconds > 0 else ""
        failed = f"; {result.failed:,} failed ({fleet.failures})" if result.failed else ""
        print(f"itertrace: fleet ingest: {result.total - result.failed:,} of {result.total:,} captures in {fleet.root} "
              f"({result.ingested:,} ingested, {result.skipped:,} done before){failed} in {result.seconds:.1f} s{rate}",
              file=sys.stderr)
    return 0


def run_summary(args: argparse.Namespace) -> int:
    """Summarize the fleet; status 1 if every capture's queries failed."""
    from itertrace.fleet.cluster import check_answers, fleet_client
    from itertrace.fleet.layout import existing, held, read_manifest
    from itertrace.fleet.runner import TaskProgress
    from itertrace.fleet.summary import QuerySettings, summarize_fleet
    from itertrace.queries.cli import parse_params

    params = tuple(sorted(parse_params(args.param).items()))
    options = _options(args)
    if options.scheduler:
        check_answers(options.scheduler)
    fleet = existing(args.fleet)
    with held(fleet):
        entries = read_manifest(fleet)
        if not any(e.status == "done" for e in entries.values()):
            raise UserError(f"{fleet.root}: no capture of the fleet has a database (all {len(entries):,} failed to "
                            f"ingest; {fleet.failures} says why)" if entries else
                            f"{fleet.root}: the fleet holds no capture yet; `itertrace fleet ingest ... --out "
                            f"{fleet.root}` adds them")
        settings = QuerySettings(params, options.task_threads(), args.memory_limit)
        progress = TaskProgress("fleet summary", 0, enabled=not args.quiet)
        with fleet_client(options, fleet.root, ()) as client:
            result = summarize_fleet(fleet, client, settings=settings, progress=progress)
    if result.failed and result.failed == result.captures:
        print(f"itertrace: fleet summary: the queries of all {result.captures:,} captures failed "
              f"({result.folder / 'failures.parquet'} lists each with its error)", file=sys.stderr)
        return 1
    if not args.quiet:
        rows = result.rows
        failed = f"; {result.failed:,} failed (fleet_failures)" if result.failed else ""
        print(f"itertrace: fleet summary: {result.summarized:,} captures, {rows['fleet_ranks']:,} ranks and GPUs, "
              f"{rows['fleet_groups']:,} groups, {rows['fleet_skew']:,} iterations compared{failed}; wrote "
              f"{result.folder} ({result.folder / 'fleet.duckdb'}) in {result.seconds:.1f} s", file=sys.stderr)
    return 0
