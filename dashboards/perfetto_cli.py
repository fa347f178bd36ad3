"""`itertrace export perfetto --db FILE -o trace.json[.gz]`: a database as a timeline for ui.perfetto.dev."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from itertrace.argtypes import at_least

DEFAULT_ITERATIONS = 1000  # perfetto.DEFAULT_ITERATIONS, written out so that --help needs no duckdb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `export` and its one format, `perfetto`."""
    export = subparsers.add_parser("export", help="write a database as a timeline other tools open",
                                   description="Write a database made by `itertrace ingest` in another tool's format.")
    formats = export.add_subparsers(dest="format", metavar="FORMAT")
    formats.required = True
    from itertrace.queries.cli import add_memory_limit

    default = DEFAULT_ITERATIONS
    p = formats.add_parser(
        "perfetto", help="Chrome-trace JSON for ui.perfetto.dev and chrome://tracing",
        description=("Write the database's timeline as Chrome-trace JSON (gzipped for a name ending .gz) that "
                     "ui.perfetto.dev and chrome://tracing open: NVTX ranges and marks per host thread (each step "
                     "range with its iteration's members and token counts from the run log), CUDA API calls, GPU work "
                     "per stream with arrows from the calls that launched it, the host gaps of each step thread split "
                     "by phase, and a track per request of the run log (queued, prefill, decode, preempted, "
                     f"finished). A capture of more than {default:,} iterations is cut to a window: by default the "
                     f"first {default:,} iterations, with everything that overlaps them."),
    )
    p.add_argument("--db", required=True, type=Path, metavar="FILE", help="database made by `itertrace ingest`")
    p.add_argument("-o", "--out", required=True, type=Path, metavar="FILE", help="timeline to write: .json or .json.gz")
    p.add_argument("--from-iteration", type=at_least(0), metavar="N", help="first iteration (default: the first)")
    p.add_argument("--to-iteration", type=at_least(0), metavar="M",
                   help=f"last iteration (default: {default - 1:,} after the first)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a query parameter for the mapping, e.g. preset=generic and step_pattern='^ProfilerStep#\\d+$' "
                        "(repeatable)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_memory_limit(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export, then say what was written and which window."""
    from itertrace.dashboards.perfetto import export_perfetto
    from itertrace.queries.cli import parse_params

    started = time.perf_counter()
    written = export_perfetto(args.db, args.out, first=args.from_iteration, last=args.to_iteration,
                              params=parse_params(args.param), memory_limit=args.memory_limit)
    if not args.quiet:
        window = written.window
        cut = (f"; the default window is the first {DEFAULT_ITERATIONS:,}, set --from-iteration/--to-iteration"
               if window.start_ns is not None and args.to_iteration is None else "")
        print(f"itertrace: wrote {written.path} ({written.events:,} events, {window.describe()}{cut}) "
              f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0
