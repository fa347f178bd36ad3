"""Answers stored in the database by the ingest, used while they are still the answer.

`itertrace ingest` (unless `--store never`, or `--store auto` on a capture of over STORE_AUTO_ROWS rows)
stores the mapping `auto` chooses (queries.suggest) and the rows of the queries of STORED, each of those in
a hidden table `_stored_NAME`, with a key in `_stored_results`: a fingerprint of everything they depend on
(the library's code and version, the SQL text of the modules read, the parameters: none, the `auto`
mapping; and the row count of each source table read). A command without parameters uses them where the
key computed now is the stored one, and computes them otherwise: a database of an older ingest, another
library, a changed module or preset, a parameter given, a table changed since. Reading needs nothing but
read access, so any number of commands may at once.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from itertrace import __version__
from itertrace.errors import UserError
from itertrace.ingest.cli import STORE_AUTO_ROWS, STORE_CHOICES  # written there for the parser, read here
from itertrace.queries import catalog
from itertrace.queries.presets import MODULE, PRESETS_FILE
from itertrace.queries.suggest import CHOOSING, MappingChoice

STORED = ("gpu_time_summary",)  # what an ingest stores: the first answer most people ask for
# --store auto stores on captures of at most STORE_AUTO_ROWS rows (ingest.cli, which the parser reads without
# importing DuckDB): on the vLLM benchmark captures the ingest took x1.27 its CPU time at 53k rows and x1.04
# at 534k with the answer stored; a longer capture computes it when asked.
RESULTS = "_stored_results"
MAPPING = "mapping"  # the row of the mapping `auto` chose (queries.suggest), stored beside the answers
_CODE = sorted(Path(__file__).parent.glob("*.py")) + [Path(__file__).parent / "sources" / "run_log.sql", PRESETS_FILE]


@dataclass(frozen=True)
class Stored:
    """Stored rows that are still the answer: the statement that reads them, and the mapping's note."""

    statement: str
    note: str | None


def fingerprint(con: duckdb.DuckDBPyConnection, modules: list[str], tables: list[str],
                params: dict[str, str]) -> str:
    """The key of a query's rows: the library's code and version, its modules' SQL, `params`, its tables' rows."""
    digest = hashlib.sha256(json.dumps([__version__, modules, tables, sorted(params.items())]).encode())
    for path in [*_CODE, *(catalog.SQL_DIR / f"{m}.sql" for m in modules if m != MODULE)]:
        digest.update(path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"\1absent"))
    for table in tables:
        digest.update(f"{table}={con.execute(f'SELECT count(*) FROM {table}').fetchall()[0][0]};".encode())
    return digest.hexdigest()


def lookup(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, str]) -> Stored | None:
    """The stored rows of the query `name` if they are its answer here now; None where it must be computed."""
    if name not in STORED or (row := _current(con, name, params)) is None:
        return None
    return Stored(f"SELECT * FROM _stored_{name}", row[0])


def stored_choice(con: duckdb.DuckDBPyConnection, params: dict[str, str]) -> MappingChoice | None:
    """The mapping `auto` chose at ingest, if it is still what it would choose here now; None where it must choose."""
    row = _current(con, MAPPING, params)
    return MappingChoice(**json.loads(row[1])) if row is not None else None


def _current(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, str]) -> tuple[str | None, str | None] | None:
    """The note and the choice stored for `name`, if its key is the one computed now; None otherwise."""
    if params:  # stored with none
        return None
    try:
        row = next(iter(con.execute(f"SELECT key, modules, tables, note, choice FROM {RESULTS} WHERE name = ?",
                                    [name]).fetchall()), None)
        if row is None or fingerprint(con, row[1], row[2], params) != row[0]:
            return None
    except duckdb.Error:  # a database of an older ingest or of one that stored nothing; a table changed since
        return None
    return row[3], row[4]


def _keep(con: duckdb.DuckDBPyConnection, name: str, reads: tuple[str, ...], rows: int, note: str | None = None,
          choice: str | None = None) -> None:
    """Record what was stored for `name`, computed from the definitions `reads`, under its key."""
    modules = sorted({d.module for d in catalog.needed(reads)})
    tables = list(dict.fromkeys(t for n in reads for t in catalog.requires(n)[0]))
    con.execute(f"INSERT INTO {RESULTS} VALUES (?, ?, ?, ?, ?, ?, ?)",
                [name, fingerprint(con, modules, tables, {}), modules, tables, note, rows, choice])


def storing(mode: str) -> Callable[[duckdb.DuckDBPyConnection, Path, int], tuple[str, ...]] | None:
    """The ingest's `finish` for `--store MODE` (STORE_CHOICES): `store` on a capture of `rows` rows, or None."""
    if mode == "never":
        return None
    return lambda con, db, rows: store(con, db) if mode == "always" or rows <= STORE_AUTO_ROWS else ()


def store(con: duckdb.DuckDBPyConnection, db: Path, names: tuple[str, ...] = STORED) -> tuple[str, ...]:
    """Store the mapping `auto` chooses here, and the rows of each of `names` that this database can answer; returns
    what was stored.

    A query that fails here is left to fail where it is asked, with its own message; one with no rows is
    left to be computed, so that the command can say why it has none."""
    from itertrace.queries.api import QueryDB  # the library's views, created in the ingest's connection

    try:
        queried = QueryDB(db, con=con)
        choice = queried.mapping_choice
    except (duckdb.Error, UserError):
        return ()
    con.execute(f"CREATE TABLE {RESULTS} (name VARCHAR PRIMARY KEY, key VARCHAR, modules VARCHAR[], "
                "tables VARCHAR[], note VARCHAR, rows BIGINT, choice VARCHAR)")
    done = []
    if choice is not None:
        _keep(con, MAPPING, CHOOSING, choice.ranges, choice=json.dumps(asdict(choice)))
        done.append(MAPPING)
    for name in names:
        query = catalog.queries()[name]
        if any(t in queried.lacking for t in query.tables):
            continue
        con.begin()
        try:
            queried.check(name)
            queried.run(name, lambda c: c.execute(f"CREATE TABLE _stored_{name} AS SELECT * FROM {name}"))
            rows = con.execute(f"SELECT count(*) FROM _stored_{name}").fetchall()[0][0]
            if rows:
                _keep(con, name, (name,), rows, note=choice.note if query.uses_mapping and choice else None)
        except duckdb.InterruptException:  # Ctrl-C or SIGTERM: the ingest stops, as anywhere else
            con.rollback()
            raise
        except (duckdb.Error, UserError):
            rows = 0
        if not rows:
            con.rollback()
            continue
        con.commit()
        done.append(name)
    return tuple(done)
