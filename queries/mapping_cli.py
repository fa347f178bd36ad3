"""`itertrace mapping suggest --db FILE`: the NVTX ranges that could be one iteration, ranked, each with its --param line."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from itertrace.argtypes import at_least
from itertrace.errors import UserError

# mapping_suggest's columns as the table shows them, with how each is written.
_SHOWN = {"rank": "{}", "name": "{}", "domain": "{}", "ranges": "{:,}", "threads": "{}", "gpu_share": "{:.0%}",
          "time_share": "{:.0%}", "overlap_share": "{:.0%}", "period_p50_ns": "{}", "period_cv": "{:.2f}",
          "score": "{:.3f}"}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `mapping` subcommand."""
    from itertrace.queries.cli import add_memory_limit

    mapping = subparsers.add_parser(
        "mapping", help="find which NVTX ranges of a capture are one iteration (mapping suggest)",
        description="Which NVTX ranges of a capture map its iterations for the queries and the report.")
    actions = mapping.add_subparsers(dest="action", metavar="ACTION", parser_class=type(mapping))
    actions.required = True
    suggest = actions.add_parser(
        "suggest", help="rank the ranges that could be one iteration, with the --param line for each",
        description=("Rank the NVTX ranges of a capture that could be one iteration (names with digits as #): how "
                     "often each repeats, whether its ranges overlap on a thread, how much of the GPU work they "
                     "launch, how steady their pace is. Each candidate comes with the exact --param line that maps "
                     "it; the last line says what the default mapping (preset=auto) chooses. The database is "
                     "opened read-only."))
    suggest.add_argument("--db", type=Path, metavar="FILE", required=True, help="database made by `itertrace ingest`")
    suggest.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    suggest.add_argument("--limit", type=at_least(1), default=5, metavar="N",
                         help="candidates to show (default %(default)s)")
    add_memory_limit(suggest)
    suggest.set_defaults(func=run_suggest)


def run_suggest(args: argparse.Namespace) -> int:
    from itertrace.queries.api import QueryDB  # DuckDB: only once a database is to be opened

    with QueryDB(args.db, memory_limit=args.memory_limit) as db:
        if "nvtx_ranges" in db.missing:
            raise UserError(f"{args.db}: no NVTX ranges in this database (they come from an Nsight Systems capture: "
                            "itertrace ingest REPORT.nsys-rep --db FILE)")
        rows = db.sql(f"SELECT * FROM mapping_suggest ORDER BY rank LIMIT {int(args.limit)}").to_pylist()
        choice = db.mapping_choice
        why = None if rows else _none_fits(db)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(why)
    else:
        print(_table(rows))
    if choice is not None:
        print(f"itertrace: {choice.note}", file=sys.stderr)
    return 0


def _none_fits(db) -> str:
    """Why mapping_suggest has no candidate, in one line."""
    repeating, gpu = db.con.execute("""
        SELECT (SELECT count(*) FROM (SELECT name, domain_key FROM _mapping_suggest_ranges GROUP BY ALL
                                      HAVING count(*) >= 4)),
               EXISTS (SELECT 1 FROM gpu_ops)""").fetchone()
    if not repeating:
        return "no NVTX range repeats at least 4 times in this capture: none could be one iteration"
    return (f"none fits: {repeating:,} range names repeat at least 4 times, but no range of them launched any of "
            "the capture's GPU work, as an iteration's range does (it launches the step's kernels); if you know the "
            "range that is one iteration, map it with --param preset=generic --param step_pattern=...")


def _table(rows: list[dict]) -> str:
    """The candidates as aligned text, then each one's --param line."""
    from itertrace.queries.output import format_table

    def cell(column: str, value: object) -> str:
        if value is None:
            return "-"
        if column == "period_p50_ns":
            return f"{value / 1e6:.3f} ms"
        return _SHOWN[column].format(value)

    shown = [[cell(c, row[c]) for c in _SHOWN] for row in rows]
    text = format_table([c.removesuffix("_ns").replace("_", " ") for c in _SHOWN], [tuple(r) for r in shown], None)
    return text + "\n" + "\n".join(f"{row['rank']}: {row['params']}" for row in rows)
