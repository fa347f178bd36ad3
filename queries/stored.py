"""Answers stored in the database by the ingest, served while they are still the answer.

`itertrace ingest` runs the queries of STORED over the database it writes (unless `--store never`, or
`--store auto` on a capture of over STORE_AUTO_ROWS rows) and keeps their rows in a hidden table,
`_stored_NAME`, with a key in `_stored_results`: a fingerprint of everything the rows depend on (the
library's code and version, the SQL text of the modules the query reads, the parameters: none, the
`auto` mapping; and the row count of each source table it reads). `itertrace query NAME` without
parameters serves the stored rows where the key computed now is the stored one, and computes them
otherwise: a database of an older ingest, another library, a changed module, a parameter given, a
table changed since. Reading needs nothing but read access, so any number of commands may at once.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from itertrace import __version__
from itertrace.errors import UserError
from itertrace.queries import catalog
from itertrace.queries.presets import MODULE, PRESETS_FILE

STORED = ("gpu_time_summary",)  # what an ingest stores: the first answer most people ask for
# --store auto stores on captures of at most this many rows: the query takes about 6 us of CPU a row, so that
# an ingest of a capture this size takes a few seconds more, and a longer one (a million iterations, where the
# GPU-time pipeline takes a minute) nothing more.
STORE_AUTO_ROWS = 1_000_000
STORE_CHOICES = ("auto", "always", "never")
RESULTS = "_stored_results"
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
    if params or name not in STORED:
        return None
    try:
        row = next(iter(con.execute(f"SELECT key, modules, tables, note FROM {RESULTS} WHERE name = ?",
                                    [name]).fetchall()), None)
        if row is None or fingerprint(con, row[1], row[2], params) != row[0]:
            return None
    except duckdb.Error:  # a database of an older ingest or of one that stored nothing; a table changed since
        return None
    return Stored(f"SELECT * FROM _stored_{name}", row[3])


def storing(mode: str) -> Callable[[duckdb.DuckDBPyConnection, Path, int], tuple[str, ...]] | None:
    """The ingest's `finish` for `--store MODE` (STORE_CHOICES): `store` on a capture of `rows` rows, or None."""
    if mode == "never":
        return None
    return lambda con, db, rows: store(con, db) if mode == "always" or rows <= STORE_AUTO_ROWS else ()


def store(con: duckdb.DuckDBPyConnection, db: Path, names: tuple[str, ...] = STORED) -> tuple[str, ...]:
    """Compute and store the rows of each of `names` that this database can answer; returns those stored.

    A query that fails here is left to fail where it is asked, with its own message; one with no rows is
    left to be computed, so that the command can say why it has none."""
    from itertrace.queries.api import QueryDB  # the library's views, created in the ingest's connection

    try:
        queried = QueryDB(db, con=con)
    except (duckdb.Error, UserError):
        return ()
    con.execute(f"CREATE TABLE {RESULTS} (name VARCHAR PRIMARY KEY, key VARCHAR, modules VARCHAR[], "
                "tables VARCHAR[], note VARCHAR, rows BIGINT)")
    done = []
    for name in names:
        query = catalog.queries()[name]
        if any(t in queried.lacking for t in query.tables):
            continue
        con.begin()
        try:
            queried.check(name)
            queried.run(name, lambda c: c.execute(f"CREATE TABLE _stored_{name} AS SELECT * FROM {name}"))
            rows = con.execute(f"SELECT count(*) FROM _stored_{name}").fetchall()[0][0]
            choice = queried.mapping_choice if query.uses_mapping else None
            modules = sorted({d.module for d in catalog.needed([name])})
            key = fingerprint(con, modules, list(query.tables), {})
            con.execute(f"INSERT INTO {RESULTS} VALUES (?, ?, ?, ?, ?, ?)",
                        [name, key, modules, list(query.tables), choice.note if choice else None, rows])
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
