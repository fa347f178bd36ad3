"""Open a database, set parameters, run queries over it and the query library.

The views a statement reads are created as temporary views of the connection when it first reads them
(queries.library; the database file is opened read-only and never changed); `itertrace query --install`
writes all of them into the file for other DuckDB clients. Only views whose source tables the database
holds are created; asking for a query that needs a missing table is a UserError naming the table and
where it comes from.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb

from itertrace.errors import UserError
from itertrace.interrupts import quiet_progress
from itertrace.ingest.plans import prefer_sort_based_joins
from itertrace.queries.catalog import SOURCE_TABLES, Query, all_params, definitions, needed, queries
from itertrace.queries.library import (ERROR_KIND, available, check_sources, create, first_line, missing_name, names_read,
                                       rebuilt_from_log, source_tables, stored_bodies, tables)
from itertrace.queries.stored import Stored, lookup, stored_choice
from itertrace.queries.suggest import CHOOSING, MappingChoice, choose_mapping, set_choice

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
MAPPING_VARIABLES = frozenset({"preset", "step_pattern", "domain"})  # what choose_mapping sets


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
        raise UserError(f"{path}: not a DuckDB database this duckdb can open ({first_line(exc)})") from None
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
    if limit is None:
        return default_memory_limit()
    from itertrace.ingest.api import MIN_MEMORY_LIMIT, memory_bytes  # pyarrow and the loaders: only for a limit given

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
    return (f"the statement ran out of memory under {given} ({ERROR_KIND.sub('', first_line(exc))}); give it "
            "more with --memory-limit")


class QueryDB:
    """A database with the query library: `db.query("host_gaps")` returns an Arrow table.

    Each statement gets the views and macros it reads, created on first use (queries.library); `con` is the
    connection with all of them.
    """

    def __init__(self, db: str | Path, params: dict[str, str] | None = None, *,
                 con: duckdb.DuckDBPyConnection | None = None, writable: tuple[Path, ...] = (),
                 memory_limit: str | None = None) -> None:
        self.path = Path(db)
        self.memory_limit = memory_limit
        self.params = params or {}
        if con is not None and not con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
            prefer_sort_based_joins(con)  # the caller's own connection, as it is: the caller trusts what it holds
        # The connection with only what has been asked for so far created in it.
        self.session = con if con is not None else connect(self.path, writable=writable, memory_limit=memory_limit)
        self.installed: set[str] = set()
        self._choice: MappingChoice | None | bool = False  # False until the mapping is chosen
        self._stored: dict[str, str] | None = None
        try:
            # the source tables the library lacks here; where it rebuilds a capture from the run log, those tables
            # are there for the queries but `missing` still names them: the database itself recorded none
            held = self._prepared(tables, self.session)
            rebuilt = rebuilt_from_log(held)
            self.lacking = self._prepared(lambda con: source_tables(con, present=held), self.session)
            self.missing = {**self.lacking, **{t: SOURCE_TABLES[t] for t in sorted(rebuilt)}}
            self._prepared(check_sources, self.session, self.lacking)
            set_params(self.session, self.params)
            if MAPPING_VARIABLES & set(self.params):  # a preset that does not fit is refused at once
                self._choose()
        except BaseException:
            if con is None:
                self.session.close()
            raise

    def __enter__(self) -> QueryDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The connection, with every view and macro of the library that this database can hold."""
        self.need(definitions())
        return self.session

    @property
    def mapping_choice(self) -> MappingChoice | None:
        """What preset=auto (the default) chose; None when the caller chose, or without a capture."""
        return self._choose()

    def _choose(self) -> MappingChoice | None:
        """Choose the mapping (queries.suggest), once: the views that read it read the variables it sets."""
        if self._choice is False:
            self._choice = None
            if "nvtx_ranges" not in self.lacking:
                self._choice = stored_choice(self.session, self.params)  # chosen at ingest, while still current
                if self._choice is not None:
                    set_choice(self.session, self._choice.params)
                else:
                    self.need(CHOOSING)
                    self._choice = choose_mapping(self.session, self.params)
        return self._choice

    def need(self, names: Iterable[str]) -> None:
        """Create the definitions among `names` that are not there yet, with those they read."""
        defs = [d for d in needed(names) if d.name not in self.installed]
        if not defs:
            return
        self.installed |= self._prepared(create, self.session, defs, self.lacking)
        if any(MAPPING_VARIABLES & d.variables for d in defs):
            self._choose()

    def run(self, statement: str, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """`work(connection)` once what `statement` reads is created; again when it names a definition only in a
        way no word of it shows (DuckDB says which when binding fails, before anything has run)."""
        if self._stored is None:
            self._stored = stored_bodies(self.session)
        words = names_read(statement, self._stored)
        self.need(words)
        if MAPPING_VARIABLES & words:  # getvariable('preset') and the like: what the mapping sets
            self._choose()
        while True:
            try:
                return work(self.session)
            except duckdb.Error as exc:
                name = missing_name(exc)
                if name not in definitions() or name in self.installed or not available(name, self.lacking):
                    raise
                self.need([name])

    def tables(self) -> set[str]:
        """The database's tables and views, and the library's views it can hold."""
        return tables(self.session) | {d.name for d in definitions().values()
                                       if d.kind == "VIEW" and available(d.name, self.lacking)}

    def mapping_note(self) -> str | None:
        """Why the trace views come out empty when the mapping matches nothing here: one line, or None.

        None too where auto found no iteration range: its own line (mapping_choice.note) says so.
        """
        if "nvtx_ranges" in self.lacking or (self.mapping_choice is not None and not self.mapping_choice.ranges):
            return None
        steps, timed = self.rows("SELECT count(*), count(device_start_ns) FROM iterations_device")[0]
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
            if table in self.lacking:
                raise UserError(f"{self.path}: query {name} needs table {table}, which this database does not have "
                                f"(it comes from {SOURCE_TABLES[table]})")
        if query.uses_mapping:
            self.rows("SELECT * FROM mapping")  # fails with a message when the mapping is incomplete
        return query

    def query(self, name: str) -> pa.Table:
        """The rows of the public view `name` (those the ingest stored, where they are still its answer)."""
        if found := self.stored(name):
            return self.sql(found.statement)
        self.check(name)
        return self.sql(f"SELECT * FROM {name}")

    def stored(self, name: str) -> Stored | None:
        """The rows of `name` the ingest stored, if they are its answer here with these parameters (queries.stored)."""
        return lookup(self.session, name, self.params)

    def sql(self, text: str) -> pa.Table:
        """Any SQL over the database and the library's views."""
        try:
            return self.run(text, lambda con: con.sql(text).to_arrow_table())
        except duckdb.Error as exc:
            raise UserError(self.explain(exc)) from None

    def rows(self, text: str) -> list[tuple]:
        """Any SQL, as `sql`, its rows as tuples (without pyarrow, which takes a command longer to import than
        most statements take to run)."""
        try:
            return self.run(text, lambda con: con.execute(text).fetchall())
        except duckdb.Error as exc:
            raise UserError(self.explain(exc)) from None

    def explain(self, exc: duckdb.Error) -> str:
        """One line for a statement that failed here."""
        return (out_of_memory(exc, self.memory_limit) or self._wrong_source(exc)
                or _explain(exc, self.lacking, self.path))

    def _wrong_source(self, exc: duckdb.Error) -> str | None:
        """For a statement that failed binding: the source table that is not as `itertrace ingest` makes it, found
        by binding each created view that reads a source table directly (views are bound only when read, so the
        library's views over such a table are not refused when they are created); None where all bind."""
        if not isinstance(exc, duckdb.BinderException):
            return None
        for d in definitions().values():
            direct = sorted(d.reads & set(SOURCE_TABLES))
            if d.kind != "VIEW" or d.name not in self.installed or not direct:
                continue
            try:
                self.session.execute(f"SELECT * FROM {d.name} LIMIT 0").fetchall()
            except duckdb.Error as failed:
                why = ERROR_KIND.sub("", first_line(failed))
                return (f"{self.path}: {' or '.join(direct)} is not as `itertrace ingest` makes it: {d.name} "
                        f"cannot be defined over it ({why})")
        return None

    def _prepared(self, step: Callable[..., T], *args) -> T:
        """`step(*args)`, a UserError naming the database when the library cannot be defined over it."""
        try:
            return step(*args)
        except UserError as exc:
            raise UserError(f"{self.path}: {exc}") from None


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
                    why = re.sub(r"^[\w ]+ Error: ", "", first_line(exc))
                    raise UserError(f"parameter {name}: {value!r} is not a regular expression ({why})") from None
        con.execute(f'SET VARIABLE "{name}" = ?', [typed])


def _explain(exc: duckdb.Error, missing: dict[str, str], path: Path) -> str:
    """One line for a failed statement; a view that was not installed is named with the table it lacks."""
    line = first_line(exc)
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
