"""Open a database, install the query library into the session, set parameters, run queries.

The views are installed as temporary views of the connection (the database file is opened
read-only and never changed), unless `install(persist=True)` writes them into the file for other
DuckDB clients. Only modules whose source tables the database holds are installed; asking for a
query that needs a missing table is a UserError naming the table and where it comes from.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb
import pyarrow as pa

from itertrace.errors import UserError
from itertrace.interrupts import quiet_progress
from itertrace.ingest.normalize import prefer_sort_based_joins
from itertrace.ingest.sqldoc import comment_statements
from itertrace.queries.catalog import OPTIONAL_TABLES, SOURCE_TABLES, Query, all_params, modules, queries, requires
from itertrace.queries.suggest import MappingChoice, choose_mapping

_ERROR_KIND = re.compile(r"^[\w ]+ Error: ")  # DuckDB's "Binder Error: " before its message
_CREATE = re.compile(r"^CREATE (MACRO|VIEW) ", re.IGNORECASE | re.MULTILINE)


def connect(db: str | Path, *, read_only: bool = True, writable: tuple[Path, ...] = (),
            memory_limit: str | None = None, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """A connection to an existing DuckDB file, locked down (`lock_down`) before anything reads it, with
    `threads` worker threads (DuckDB's default when None); a missing, foreign or locked file is a UserError."""
    path = Path(db)
    if not path.is_file():
        raise UserError(f"{path}: no such database (make one with `itertrace ingest SOURCE... --db {path}`)")
    limit = check_memory_limit(memory_limit)
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        if held := re.search(r"Conflicting lock is held in (.+?) \(PID (\d+)\)", str(exc)):
            how = "read-write " if read_only else ""  # a writer waits for readers too
            raise UserError(f"{path}: open {how}in process {held.group(2)} ({held.group(1)}); close it there "
                            "first") from None
        raise UserError(f"{path}: not a DuckDB database this duckdb can open ({_first_line(exc)})") from None
    try:
        if con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
            _check_locked(con, path, writable)
        else:
            if threads is not None:
                con.execute(f"SET threads = {int(threads)}")
            lock_down(con, writable, limit)
    except BaseException:
        con.close()
        raise
    return con


def lock_down(con: duckdb.DuckDBPyConnection, writable: tuple[Path, ...], memory_limit: str) -> None:
    """Hold `con` to reading its database and writing only the files in `writable`, within `memory_limit`.

    A database may come from anyone, and its views are SQL of its author's: this runs before any statement
    touches them. No other file is read or written (no read_text or read_csv of a path, no COPY TO, EXPORT
    DATABASE or ATTACH), no extension is installed or loaded (so no network: httpfs is one), and the
    configuration is locked, so that no statement undoes this. DuckDB may still spill to its temporary
    directory beside the database. Irreversible for the connection.
    """
    quiet_progress(con)  # DuckDB's bar would land in the rows written to stdout
    prefer_sort_based_joins(con)
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET allowed_paths = ?", [[str(path) for path in writable]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _check_locked(con: duckdb.DuckDBPyConnection, path: Path, writable: tuple[Path, ...]) -> None:
    """A second connection to a file this process has open shares its DuckDB instance, settings and lock
    included: fine if that lock is `lock_down`'s and allows the paths this one writes; else a UserError."""
    external, allowed = con.execute("SELECT current_setting('enable_external_access'), "
                                    "current_setting('allowed_paths')").fetchone()
    if external or not {str(p) for p in writable} <= set(allowed):
        raise UserError(f"{path}: already open in this process with other settings; close it there first")


def default_memory_limit() -> str:
    """Half the machine's memory, at most 4 GB: DuckDB's own default, 80%, let one ad-hoc statement take
    19.6 GB of a 24 GB machine before it failed. Past the limit DuckDB spills sorts, joins and
    aggregates to disk; what it cannot spill fails with a message that names the limit."""
    try:
        half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (OSError, ValueError):
        half = 4 << 30
    return f"{min(half, 4 << 30) >> 20}MiB"


def check_memory_limit(limit: str | None) -> str:
    """`limit` (or the default) as DuckDB takes it; a UserError for one that is not a size or too small."""
    from itertrace.ingest.api import MIN_MEMORY_LIMIT, memory_bytes

    if limit is None:
        return default_memory_limit()
    size = memory_bytes(limit)
    if size is None:
        raise UserError(f"--memory-limit {limit}: not a size, such as 512MB or 2GB")
    if size < MIN_MEMORY_LIMIT:
        raise UserError(f"--memory-limit {limit}: below the {MIN_MEMORY_LIMIT >> 20} MiB DuckDB needs at least")
    return f"{size}B"


def out_of_memory(exc: BaseException, limit: str | None) -> str | None:
    """One line for a statement that ran out of memory under `limit` (None: the default); None for other errors."""
    if not isinstance(exc, duckdb.OutOfMemoryException):
        return None
    given = f"--memory-limit {limit}" if limit else f"the default --memory-limit {default_memory_limit()}"
    return (f"the statement ran out of memory under {given} ({_ERROR_KIND.sub('', _first_line(exc))}); give it "
            "more with --memory-limit")


# Why a database holds none of SOURCE_TABLES, for the commands that refuse it.
NOT_INGESTED = ("no table of `itertrace ingest` in this database (a capture gives nvtx_ranges, a run directory "
                "run_iterations)")


class QueryDB:
    """A database with the query library installed: `db.query("host_gaps")` returns an Arrow table."""

    def __init__(self, db: str | Path, params: dict[str, str] | None = None, *,
                 con: duckdb.DuckDBPyConnection | None = None, writable: tuple[Path, ...] = (),
                 memory_limit: str | None = None) -> None:
        self.path = Path(db)
        self.memory_limit = memory_limit
        if con is not None and not con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
            prefer_sort_based_joins(con)  # the caller's own connection, as it is: the caller trusts what it holds
        self.con = con if con is not None else connect(self.path, writable=writable, memory_limit=memory_limit)
        try:
            try:
                self.missing = install(self.con)
            except UserError as exc:
                raise UserError(f"{self.path}: {exc}") from None
            set_params(self.con, params or {})
            # What preset=auto (the default) chose; None when the caller chose, or without a capture.
            self.mapping_choice: MappingChoice | None = (
                None if "nvtx_ranges" in self.missing else choose_mapping(self.con, params or {}))
        except BaseException:
            if con is None:
                self.con.close()
            raise

    def __enter__(self) -> QueryDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def tables(self) -> set[str]:
        return _tables(self.con)

    def mapping_note(self) -> str | None:
        """Why the trace views come out empty when the mapping matches nothing here: one line, or None.

        None too where auto found no iteration range: its own line (mapping_choice.note) says so.
        """
        if "nvtx_ranges" in self.missing or (self.mapping_choice is not None and not self.mapping_choice.ranges):
            return None
        steps, timed = self.con.execute("SELECT count(*), count(device_start_ns) FROM _iterations_device").fetchone()
        if not steps:
            return ("the mapping matches no step range in nvtx_ranges: check step_pattern and domain "
                    "(`SELECT * FROM mapping` shows them; docs/queries.md lists the parameters)")
        if not timed:
            return (f"none of the {steps:,} step ranges has a device interval (no GPU work inside it, no range "
                    "matching device_pattern): on a trace without GPU work, set device_pattern")
        return None

    def check(self, name: str) -> Query:
        """The query called `name`, if this database holds every table it needs."""
        query = queries().get(name)
        if query is None:
            raise UserError(f"unknown query {name!r}; `itertrace query --list` lists them")
        for table in query.tables:
            if table in self.missing:
                raise UserError(f"{self.path}: query {name} needs table {table}, which this database does not have "
                                f"(it comes from {SOURCE_TABLES[table]})")
        if query.uses_mapping:
            self.sql("SELECT * FROM mapping")  # fails with a message when the mapping is incomplete
        return query

    def query(self, name: str) -> pa.Table:
        """The rows of the public view `name`."""
        self.check(name)
        return self.sql(f"SELECT * FROM {name}")

    def sql(self, text: str) -> pa.Table:
        """Any SQL over the database and the installed views."""
        try:
            return self.con.sql(text).to_arrow_table()
        except duckdb.Error as exc:
            raise UserError(self.explain(exc)) from None

    def explain(self, exc: duckdb.Error) -> str:
        """One line for a statement that failed here."""
        return out_of_memory(exc, self.memory_limit) or _explain(exc, self.missing, self.path)


def install(con: duckdb.DuckDBPyConnection, *, persist: bool = False) -> dict[str, str]:
    """Install every module whose tables exist; returns the missing tables, each with what comes from it.

    Temporary views and macros by default; `persist=True` writes them into the database file.
    """
    present = _tables(con)
    missing = {t: SOURCE_TABLES[t] for t in SOURCE_TABLES if t not in present}
    if persist and len(missing) == len(SOURCE_TABLES):  # not an itertrace database: write nothing into it
        raise UserError(f"{NOT_INGESTED}; nothing to install")
    if "nvtx_ranges" in present:  # a capture ingested before these tables existed
        for table, columns in OPTIONAL_TABLES.items():
            if table in missing:
                con.execute(f"CREATE {'' if persist else 'TEMP '}TABLE {table} ({columns})")
                del missing[table]
    replace = "CREATE OR REPLACE " if persist else "CREATE OR REPLACE TEMP "
    installed: set[str] = set()
    for mod in modules():
        for d in mod.definitions:
            tables = requires(d.name)[0]
            if any(t in missing for t in tables):
                continue
            try:
                con.execute(_CREATE.sub(lambda m: replace + m.group(1).upper() + " ", d.statement, count=1))
            except duckdb.Error as exc:  # a table of that name, but not as `itertrace ingest` makes it
                why = _ERROR_KIND.sub("", _first_line(exc))
                raise UserError(f"{' or '.join(tables) or d.name} is not as `itertrace ingest` makes it: {d.name} "
                                f"cannot be defined over it ({why})") from None
            installed.add(d.name)
        if persist:
            for statement in comment_statements(mod.sql):
                if statement.split()[3].split(".")[0] in installed:
                    con.execute(statement)
    return missing


def set_params(con: duckdb.DuckDBPyConnection, params: dict[str, str]) -> None:
    """Set the session variables the views read, checking each name, type and choice."""
    known = all_params()
    for name, value in params.items():
        param = known.get(name)
        if param is None:
            raise UserError(f"unknown parameter {name!r}; parameters: {', '.join(sorted(known))}")
        if param.choices and value not in param.choices:
            raise UserError(f"parameter {name} must be one of {', '.join(param.choices)}, not {value!r}")
        if param.type == "BIGINT":
            try:
                typed: object = int(value)
            except ValueError:
                raise UserError(f"parameter {name} must be an integer, not {value!r}") from None
            if not -2**63 <= typed < 2**63:
                raise UserError(f"parameter {name} is out of range (a 64-bit integer), not {value!r}")
            if param.minimum is not None and typed < param.minimum:
                raise UserError(f"parameter {name} must be at least {param.minimum}, not {value!r}")
        elif param.type == "DOUBLE":
            try:
                typed = float(value)
            except ValueError:
                raise UserError(f"parameter {name} must be a number, not {value!r}") from None
        else:
            typed = value
            if name.endswith("_pattern"):  # a bad pattern would fail later, in a view, without its name
                try:
                    con.execute("SELECT regexp_matches('', ?)", [value])
                except duckdb.Error as exc:
                    why = re.sub(r"^[\w ]+ Error: ", "", _first_line(exc))
                    raise UserError(f"parameter {name}: {value!r} is not a regular expression ({why})") from None
        con.execute(f'SET VARIABLE "{name}" = ?', [typed])


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                       "UNION SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal").fetchall()
    return {r[0] for r in rows}


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _explain(exc: duckdb.Error, missing: dict[str, str], path: Path) -> str:
    """One line for a failed statement; a view that was not installed is named with the table it lacks."""
    line = _first_line(exc)
    if m := re.search(r"Table with name (\w+) does not exist", line):
        name = m.group(1)
        if name in missing:
            return f"{path}: no table {name} in this database (it comes from {missing[name]})"
        query = queries().get(name)
        if query is not None:
            lacking = [t for t in query.tables if t in missing]
            if lacking:
                return (f"{path}: view {name} is not available: this database has no table {lacking[0]} "
                        f"(it comes from {missing[lacking[0]]})")
    return re.sub(r"^[\w ]+ Error: ", "", line)
