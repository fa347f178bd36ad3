"""Small normalized tables folded into one table, each read through a view of its own name.

DuckDB gives every table at least one block of its file (64 KiB here), however few its rows: a small
capture's threads, processes, capture_meta, nvtx_domains and its few hundred ranges took one block each.
`fold_small_tables` moves the rows of every such table into `main._small_tables`, each column in a slot
of its own type (`BIGINT_0`, `VARCHAR_0`, `INTEGER_0`, ...: no value changes type), and replaces the
table by a view with its name, columns, order and comments. Tables with more than `FOLD_ROWS` rows, and
empty ones (which take no block), stay tables.
"""
from __future__ import annotations

import re

import duckdb

from itertrace.ingest.loader import quote
from itertrace.ingest.sqldoc import literal

TABLE = "_small_tables"
FOLD_ROWS = 100_000


def fold_small_tables(con: duckdb.DuckDBPyConnection, names: list[str]) -> list[str]:
    """Fold those of the main-schema tables `names` that hold 1 to `FOLD_ROWS` rows; the names folded."""
    present = {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND database_name = current_database()"
    ).fetchall()}
    counts = {name: con.execute(f"SELECT count(*) FROM main.{quote(name)}").fetchone()[0]
              for name in names if name in present}
    folded = sorted((name for name, n in counts.items() if 0 < n <= FOLD_ROWS), key=lambda name: (counts[name], name))
    if not folded:
        return []
    columns = {name: _columns(con, name) for name in folded}
    width: dict[str, int] = {}
    places: dict[str, list[str]] = {}
    for name in folded:
        used: dict[str, int] = {}
        places[name] = []
        for _, kind, _ in columns[name]:
            places[name].append(_slot(kind, used.get(kind, 0)))
            used[kind] = used.get(kind, 0) + 1
        width = {kind: max(width.get(kind, 0), used.get(kind, 0)) for kind in width.keys() | used.keys()}
    slots = {_slot(kind, i): kind for kind in sorted(width) for i in range(width[kind])}
    # Text in dictionaries: DuckDB's own choice between them and FSST varied from run to run for the same
    # values, and with it the blocks this table takes.
    declared = ", ".join(["table_id INTEGER", "row_id BIGINT", *(
        f"{quote(slot)} {kind}{' USING COMPRESSION dictionary' if kind == 'VARCHAR' else ''}" for slot, kind in slots.items())])
    con.execute(f"CREATE TABLE main.{TABLE} ({declared})")
    for number, name in enumerate(folded):
        have = dict(zip(places[name], (column for column, _, _ in columns[name])))
        values = ", ".join(quote(have[slot]) if slot in have else "NULL" for slot in slots)
        con.execute(f"INSERT INTO main.{TABLE} SELECT {number}, rowid, {values} FROM main.{quote(name)} ORDER BY rowid")
    for number, name in enumerate(folded):
        comment = con.execute("SELECT comment FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = ? "
                              "AND database_name = current_database()", [name]).fetchone()[0]
        con.execute(f"DROP TABLE main.{quote(name)}")
        select = ", ".join(f"{quote(slot)} AS {quote(column)}" for slot, (column, _, _) in zip(places[name], columns[name]))
        con.execute(f"CREATE VIEW main.{quote(name)} AS SELECT {select} FROM main.{TABLE} "
                    f"WHERE table_id = {number} ORDER BY row_id")
        if comment:
            con.execute(f"COMMENT ON VIEW main.{quote(name)} IS {literal(comment)}")
        for column, _, text in columns[name]:
            if text:
                con.execute(f"COMMENT ON COLUMN main.{quote(name)}.{quote(column)} IS {literal(text)}")
    users: dict[str, list[str]] = {slot: [] for slot in slots}
    for name in folded:
        for slot, (column, _, _) in zip(places[name], columns[name]):
            users[slot].append(f"{name}.{column}")
    comments = {"table_id": "Which table the row is of: the number in each view's WHERE table_id = ...",
                "row_id": "The row's position in its table: each view's order.",
                **{slot: f"{kind} values of {', '.join(users[slot])}." for slot, kind in slots.items()}}
    for column, text in comments.items():
        con.execute(f"COMMENT ON COLUMN main.{TABLE}.{quote(column)} IS {literal(text)}")
    con.execute(f"COMMENT ON TABLE main.{TABLE} IS " + literal(
        f"The rows of the small tables ({', '.join(folded)}; at most {FOLD_ROWS:,} rows each), one row per row: "
        "the table's number, the row's position in it, and each column in a slot of its type; read them through "
        "the view named after each table."))
    return folded


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str, str | None]]:
    return con.execute("SELECT column_name, data_type, comment FROM duckdb_columns() WHERE schema_name = 'main' "
                       "AND table_name = ? AND database_name = current_database() ORDER BY column_index",
                       [table]).fetchall()


def _slot(kind: str, i: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9]+', '_', kind)}_{i}"
