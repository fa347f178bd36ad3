"""`itertrace query` (the library's views by name) and `itertrace sql` (any SQL over them)."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from itertrace.argtypes import at_least
from itertrace.errors import UserError
from itertrace.queries.catalog import all_params, modules, queries
from itertrace.queries.presets import MODULE

# DuckDB and pyarrow are imported by the commands that open a database, not to build the parser
# (nor for --list and --describe, which read only the SQL files).
if TYPE_CHECKING:
    from itertrace.queries.api import QueryDB
    from itertrace.queries.output import Output

FORMATS = ("table", "csv", "json", "parquet")  # itertrace.queries.output.FORMATS (a test checks they agree)
CONTRACT = ("`itertrace query` and `sql` read only their database and write only the file --out names: no other "
            "file, no extension, no network, no setting changed; see docs/queries.md")
# How DuckDB says that a statement went past the contract (queries.api.lock_down).
_CONFINED = re.compile(r"disabled by configuration|disabled through configuration|configuration has been locked")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `query` and `sql` subcommands."""
    q = subparsers.add_parser(
        "query", help="run a query of the library by name (--list lists them)",
        usage="itertrace query --list | NAME --describe | NAME --db FILE [options] | --install --db FILE",
        description=("Run one of the library's queries (SQL views over a database made by `itertrace ingest`): "
                     "host gaps and their attribution, iteration intervals, request latency from the run log "
                     "and from the trace, latency by class, batch membership and slots, fairness, scheduler "
                     "overhead. The database is opened read-only."))
    q.add_argument("name", nargs="?", metavar="NAME", help="query to run (see --list)")
    q.add_argument("--list", action="store_true", help="list the queries, one line each")
    q.add_argument("--describe", action="store_true", help="show what NAME answers, its columns and parameters")
    q.add_argument("--install", action="store_true",
                   help="write every view into --db, so that any DuckDB client sees them (the only write)")
    _common(q)
    q.set_defaults(func=run_query)

    s = subparsers.add_parser(
        "sql", help="run any SQL over a database with the library's views installed",
        description="Run one SQL statement over a database and the library's views (read-only).")
    s.add_argument("statement", metavar="SQL", help='the statement, e.g. "SELECT * FROM host_gaps_summary"')
    _common(s)
    s.set_defaults(func=run_sql)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, metavar="FILE", help="database made by `itertrace ingest`")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="set a parameter, e.g. preset=generic or step_pattern='^decode_step_\\d+$' "
                             "(repeatable)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write to FILE instead of standard output")
    parser.add_argument("--max-rows", type=at_least(0), default=40, metavar="N",
                        help="rows the table format shows on a terminal (default %(default)s)")
    add_memory_limit(parser)


def add_memory_limit(parser: argparse.ArgumentParser) -> None:
    """The --memory-limit option of the commands that open a database to read it."""
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="most memory DuckDB may use, e.g. 2GB; past it, it spills to disk or the statement "
                             "fails saying so (default: half this machine's memory, at most 4 GB)")


def run_query(args: argparse.Namespace) -> int:
    if args.list:
        _list()
        return 0
    if args.install:
        return _install(args)
    if not args.name:
        raise UserError("query: give a query NAME, or --list to see them")
    query = queries().get(args.name)
    if query is None:
        close = difflib.get_close_matches(args.name, list(queries()), n=1)
        hint = f"; did you mean {close[0]}?" if close else "; `itertrace query --list` lists them"
        raise UserError(f"unknown query {args.name!r}{hint}")
    if args.describe:
        print(describe(args.name))
        return 0
    params = parse_params(args.param)
    takes = {p.name for p in query.params}
    for name in params:
        if name not in takes:
            raise UserError(f"query {args.name} takes no parameter {name!r} "
                            f"(it takes: {', '.join(sorted(takes)) or 'none'})")
    with _opened(args, params) as (db, out):
        if stored := db.stored(args.name):  # the rows the ingest stored, still the answer
            rows, note = _write(db, stored.statement, out, args), None
            if stored.note:
                print(f"itertrace: note: {stored.note}", file=sys.stderr)
        else:
            db.check(args.name)
            rows = _write(db, f"SELECT * FROM {args.name}", out, args)
            if query.uses_mapping and db.mapping_choice:  # preset=auto: say which mapping it chose
                print(f"itertrace: note: {db.mapping_choice.note}", file=sys.stderr)
            note = db.mapping_note() if not rows and "nvtx_ranges" in query.tables else None
    _done(rows, args.out)
    if note:
        print(f"itertrace: note: {note}", file=sys.stderr)
    return 0


def run_sql(args: argparse.Namespace) -> int:
    import duckdb  # only once a database is to be opened

    statement = args.statement.strip().rstrip(";")
    if bad := _not_utf8(statement):
        raise UserError(f"sql: the statement is not valid UTF-8 ({bad})")
    if not statement:
        raise UserError("sql: the statement is empty; give one, e.g. \"SELECT * FROM host_gaps_summary\"")
    try:
        count = len(duckdb.extract_statements(statement))
    except duckdb.Error:
        count = 1  # a syntax error: DuckDB says where when the statement runs
    if count > 1:
        raise UserError(f"sql: {count} statements given; give one (one `itertrace sql` per statement)")
    with _opened(args, parse_params(args.param)) as (db, out):
        rows = _write(db, statement, out, args)
    _done(rows, args.out)
    return 0


def describe(name: str) -> str:
    """What a query answers, its columns and its parameters, as text."""
    query = queries()[name]
    lines = [f"{name}: {query.doc.text}", "", "columns:"]
    width = max(len(c) for c in query.doc.columns)
    lines += [f"  {col.ljust(width)}  {text}" for col, text in query.doc.columns.items()]
    if query.params:
        lines += ["", "parameters (--param KEY=VALUE):"]
        lines += [f"  {p.name}: {p.doc}" + (f" One of: {', '.join(p.choices)}." if p.choices else "")
                  + (f" At least {p.minimum}." if p.minimum is not None else "") for p in query.params]
    source = "presets.toml" if query.module.name == MODULE else f"{query.module.name}.sql"
    lines += ["", f"needs tables: {', '.join(query.tables)}", f"defined in: queries/{source}"]
    return "\n".join(lines)


def _list() -> None:
    width = max(len(n) for n in queries())
    for mod in modules():
        if not mod.views:
            continue
        print(f"{mod.name}.sql: {_first_sentence(mod.doc)}")
        for doc in mod.views:
            print(f"  {doc.table.ljust(width)}  {queries()[doc.table].summary}")


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _install(args: argparse.Namespace) -> int:
    from itertrace.queries.api import connect, set_params
    from itertrace.queries.library import install

    params = parse_params(args.param)
    con = connect(_db(args), read_only=False)
    try:
        set_params(con, params)  # checked before anything is written
        try:
            missing = install(con, persist=True)
        except UserError as exc:
            raise UserError(f"{args.db}: {exc}") from None
    finally:
        con.close()
    installed = [q for q in queries().values() if not any(t in missing for t in q.tables)]
    print(f"itertrace: installed {len(installed)} views into {args.db}; in DuckDB, parameters are "
          "`SET VARIABLE name = value` (see `itertrace query NAME --describe`)", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _opened(args: argparse.Namespace, params: dict[str, str]) -> Iterator[tuple[QueryDB, Output]]:
    """The output --format and --out ask for, then the database, opened read-only and locked down to
    reading itself and writing that output (see docs/queries.md)."""
    from itertrace.queries.api import QueryDB
    from itertrace.queries.output import output

    db = _db(args)
    if args.out is not None and args.out.resolve() == db.resolve():
        raise UserError(f"--out {args.out}: is the database itself; write the rows to another file")
    with output(args.format, args.out) as out, \
            QueryDB(db, params, writable=out.writable, memory_limit=args.memory_limit) as opened:
        yield opened, out


def _write(db: QueryDB, sql: str, out: Output, args: argparse.Namespace) -> int:
    """Write the statement's rows to `out`; a failed statement is one line."""
    import duckdb

    from itertrace.interrupts import interruptible
    from itertrace.queries.output import write

    try:
        with interruptible(db.session):
            return db.run(sql, lambda con: write(con, sql, out, max_rows=args.max_rows))
    except duckdb.Error as exc:
        line = db.explain(exc)
        if _CONFINED.search(line):
            line += f" ({CONTRACT})"
        raise UserError(line) from None


def _db(args: argparse.Namespace) -> Path:
    if args.db is None:
        raise UserError("--db FILE is required: the database made by `itertrace ingest`")
    return args.db


def parse_params(pairs: list[str]) -> dict[str, str]:
    """`KEY=VALUE` strings as a dict, each key a known parameter."""
    params: dict[str, str] = {}
    known = all_params()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--param {pair!r}: expected KEY=VALUE")
        if key not in known:
            raise UserError(f"--param {key}: unknown parameter; parameters: {', '.join(sorted(known))}")
        if key in params:
            raise UserError(f"--param {key}: given twice ({params[key]!r}, then {value!r}); give it once")
        if bad := _not_utf8(value):
            raise UserError(f"--param {key}: the value is not valid UTF-8 ({bad})")
        params[key] = value
    return params


def _not_utf8(text: str) -> str | None:
    """Where `text` (an argument, undecodable bytes kept as surrogates) is not UTF-8; None when it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = text[exc.start].encode("utf-8", "surrogateescape") if "\udc80" <= text[exc.start] <= "\udcff" else b"?"
        return f"byte 0x{byte.hex()} at character {exc.start + 1}"
    return None


def _done(rows: int, out: Path | None) -> None:
    if out is not None:
        print(f"itertrace: wrote {rows:,} rows to {out}", file=sys.stderr)
