"""Creating the library's views and macros in a connection: all of them, or those a statement reads.

A command creates what its statement names, with what those read in turn, as views DuckDB binds when
they are read (`deferred`). `names_read` over-approximates (any word of the statement, and of the
database's own views that it names); a statement that still reads a definition not yet created (one it
builds from parts of a string, or a macro of the database reads) fails binding with DuckDB's missing-name
error, before it has run: `missing_name` says which, and the caller creates it and runs the statement again.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import duckdb

from itertrace.errors import UserError
from itertrace.ingest.sqldoc import comment_statements
from itertrace.queries.catalog import OPTIONAL_TABLES, SOURCE_TABLES, Definition, definitions, modules, requires

ERROR_KIND = re.compile(r"^[\w ]+ Error: ")  # DuckDB's "Binder Error: " before its message
_CREATE = re.compile(r"^CREATE (MACRO|VIEW) ", re.IGNORECASE | re.MULTILINE)
_WORD = re.compile(r"\w+")
_MISSING = re.compile(r"^Catalog Error: (?:Table|Scalar Function|Table Function|Macro Function) with name (\w+) "
                      r"does not exist")

# The capture a run's log stands for, where a database holds the run and no capture (see the file).
RUN_LOG_CAPTURE = Path(__file__).parent / "sources" / "run_log.sql"
RUN_LOG_TABLES = frozenset({"nvtx_ranges", "nvtx_marks", "gpu_ops", "cuda_api", "nvtx_gpu_projection"})

# Why a database holds none of SOURCE_TABLES, for the commands that refuse it.
NOT_INGESTED = ("no table of `itertrace ingest` in this database (a capture gives nvtx_ranges, a run directory "
                "run_iterations)")


def install(con: duckdb.DuckDBPyConnection, *, persist: bool = False) -> dict[str, str]:
    """Install every module whose tables exist; returns the missing tables, each with what comes from it.

    Temporary views and macros by default; `persist=True` writes them into the database file.
    """
    missing = source_tables(con, persist=persist)
    installed = create(con, definitions().values(), missing, persist=persist)
    if persist:
        for mod in modules():
            for statement in comment_statements(mod.sql):
                if statement.split()[3].split(".")[0] in installed:
                    con.execute(statement)
    return missing


def rebuilt_from_log(present: set[str]) -> frozenset[str]:
    """The source tables a session over a database of the tables `present` rebuilds from its run log: those of
    RUN_LOG_CAPTURE where it holds a run directory and no capture, else none."""
    return RUN_LOG_TABLES if "nvtx_ranges" not in present and "run_iterations" in present else frozenset()


def source_tables(con: duckdb.DuckDBPyConnection, *, persist: bool = False,
                  present: set[str] | None = None) -> dict[str, str]:
    """The source tables this database lacks, each with what comes from it; an empty table stands in for each
    optional one that a capture ingested before it existed lacks (temporary unless `persist`). In a session
    (not `persist`) over a run directory without a capture, the capture its log stands for is created as
    temporary views (RUN_LOG_CAPTURE), so those tables are not lacking. `present`: tables(con), if known."""
    present = set(tables(con) if present is None else present)
    missing = {t: SOURCE_TABLES[t] for t in SOURCE_TABLES if t not in present}
    if persist and len(missing) == len(SOURCE_TABLES):  # not an itertrace database: write nothing into it
        raise UserError(f"{NOT_INGESTED}; nothing to install")
    if not persist and (rebuilt := rebuilt_from_log(present)):  # a run alone: the capture its log stands for
        for statement in RUN_LOG_CAPTURE.read_text().split(";\n\n"):
            if statement.strip():
                con.execute(statement)
        missing = {t: why for t, why in missing.items() if t not in rebuilt}
        present |= rebuilt
    if "nvtx_ranges" in present:  # a capture ingested before these tables existed
        for table, columns in OPTIONAL_TABLES.items():
            if table in missing:
                con.execute(f"CREATE {'' if persist else 'TEMP '}TABLE {table} ({columns})")
                del missing[table]
    return missing


def available(name: str, missing: dict[str, str]) -> bool:
    """Whether the definition `name` can be created on a database that lacks the tables `missing`."""
    return not any(t in missing for t in requires(name)[0])


def create(con: duckdb.DuckDBPyConnection, defs: Iterable[Definition], missing: dict[str, str], *,
           persist: bool = False) -> set[str]:
    """Create each of `defs` (in installation order) whose tables exist; returns the names created."""
    replace = "CREATE OR REPLACE " if persist else "CREATE OR REPLACE TEMP "
    created: set[str] = set()
    for d in defs:
        if not available(d.name, missing):
            continue
        statement = _CREATE.sub(lambda m: replace + m.group(1).upper() + " ", d.statement, count=1)
        try:
            con.execute(statement if persist or d.kind != "VIEW" else deferred(statement))
        except duckdb.Error as exc:  # a table of that name, but not as `itertrace ingest` makes it
            tables = requires(d.name)[0]
            why = ERROR_KIND.sub("", first_line(exc))
            raise UserError(f"{' or '.join(tables) or d.name} is not as `itertrace ingest` makes it: {d.name} "
                            f"cannot be defined over it ({why})") from None
        created.add(d.name)
    return created


def deferred(statement: str) -> str:
    """A CREATE VIEW statement that DuckDB binds when the view is read, not when it is created.

    Binding a view binds every view below it, and a statement that reads the view binds them again:
    created bound, the whole library cost several times what a query over it costs to bind.
    """
    depth = 0
    for at, _ in duckdb.tokenize(statement):  # the AS after the name and its column list, comments skipped
        depth += {"(": 1, ")": -1}.get(statement[at], 0)
        if depth == 0 and re.match(r"AS\b", statement[at:at + 3], re.IGNORECASE):
            return f"{statement[:at]}WITH (DEFER_BINDING) {statement[at:]}"
    raise ValueError(f"not a CREATE VIEW ... AS statement: {statement[:80]}")


def check_sources(con: duckdb.DuckDBPyConnection, missing: dict[str, str]) -> None:
    """A UserError for a source table that is a view of the database which does not bind (the views over it are
    bound only when read: this says which table is wrong, before any statement reads it)."""
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary "
                                       "AND schema_name = 'main'").fetchall()}
    for table in SOURCE_TABLES:
        if table in views and table not in missing:
            try:
                con.sql(f"SELECT * FROM {table}")
            except duckdb.Error as exc:
                why = ERROR_KIND.sub("", first_line(exc))
                raise UserError(f"{table} is not as `itertrace ingest` makes it: it cannot be read ({why})") from None


def tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables and views of the database, and the temporary ones of the connection."""
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                       "UNION SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal").fetchall()
    return {r[0] for r in rows}


def stored_bodies(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The SQL of the database's own views, by name (lower case). Not its macros: listing them costs a command
    more than the rest of its start; a macro of the database that reads the library gets what it reads when
    binding misses it."""
    rows = con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND NOT temporary").fetchall()
    return {name.lower(): body or "" for name, body in rows}


def names_read(statement: str, stored: dict[str, str]) -> set[str]:
    """Every word of `statement` (lower case), and of the bodies in `stored` of those it names, in turn."""
    words: set[str] = set()
    todo = [statement]
    while todo:
        new = {w.lower() for w in _WORD.findall(todo.pop())} - words
        words |= new
        todo += [stored[w] for w in new if w in stored]
    return words


def missing_name(exc: duckdb.Error) -> str | None:
    """The name of the table, view or macro a statement failed binding for lack of; None for other errors."""
    m = _MISSING.match(first_line(exc)) if isinstance(exc, duckdb.CatalogException) else None
    return m.group(1).lower() if m else None


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
