"""`itertrace ingest SOURCE... --db FILE`: nsys reports and exports into one DuckDB database."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from itertrace.ingest.api import IngestOptions, default_loaders, ingest
from itertrace.ingest.progress import Progress


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `ingest` subcommand."""
    parser = subparsers.add_parser(
        "ingest",
        help="load nsys reports and exports into a DuckDB database",
        description=("Load Nsight Systems captures (.nsys-rep, an Arrow export, or an arrowdir or parquetdir "
                     "folder) into one DuckDB database: nsys's own tables in the schema `nsys`, and documented "
                     "tables such as nvtx_ranges, gpu_ops, cuda_api and nvtx_gpu_projection beside them."),
    )
    parser.add_argument("sources", nargs="+", type=Path, metavar="SOURCE", help="report, export file or folder")
    parser.add_argument("--db", required=True, type=Path, metavar="FILE", help="database to write (replaced on success)")
    parser.add_argument("--batch-rows", type=_positive, default=IngestOptions.batch_rows, metavar="N",
                        help="rows per batch streamed into DuckDB (default %(default)s)")
    parser.add_argument("--memory-limit", metavar="SIZE", help="DuckDB memory limit, e.g. 2GB (default: DuckDB's)")
    parser.add_argument("--nsys", metavar="PATH", help="nsys executable for .nsys-rep sources (default: on PATH)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no closing line")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the ingest and print the closing line: rows, sources, time, rows/s."""
    options = IngestOptions(batch_rows=args.batch_rows, memory_limit=args.memory_limit)
    progress = Progress(sys.stderr, enabled=not args.quiet)
    result = ingest(args.sources, args.db, loaders=default_loaders(args.nsys), options=options, progress=progress)
    if not args.quiet:
        sources = f"{len(result.sources)} source{'s' if len(result.sources) != 1 else ''}"
        print(f"itertrace: ingested {result.rows:,} rows from {sources} into {result.db} in {result.seconds:.1f} s "
              f"({result.rows_per_s:,.0f} rows/s)", file=sys.stderr)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value
