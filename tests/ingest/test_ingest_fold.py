"""Folding small tables into one (ingest/fold.py): every value, type, order and comment survives."""
from __future__ import annotations

import duckdb
import pytest

from itertrace.ingest import fold

ROWS = [  # in insertion order, which is not sorted: the view must keep it
    (3, "c", 18446744073709551615, -2147483648, 1.5, True, None),
    (1, None, 0, 7, -0.25, False, [1, 2]),
    (2, "a'b", 9223372036854775808, None, None, None, []),
]


@pytest.fixture
def con():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id BIGINT, name VARCHAR, big UBIGINT, small INTEGER, f FLOAT, flag BOOLEAN, "
                "ids BIGINT[])")
    con.execute("INSERT INTO t VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(ROWS)),
                [value for row in ROWS for value in row])
    con.execute("COMMENT ON TABLE t IS 'the table'")
    con.execute("COMMENT ON COLUMN t.big IS 'an unsigned one'")
    con.execute("CREATE TABLE u (id BIGINT, label VARCHAR)")
    con.execute("INSERT INTO u VALUES (10, 'x'), (11, 'y')")
    con.execute("CREATE TABLE empty (id BIGINT)")
    con.execute("CREATE TABLE big (id BIGINT)")
    con.execute("INSERT INTO big SELECT range FROM range(5)")
    yield con
    con.close()


def test_small_tables_become_views_with_their_rows_types_order_and_comments(con, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_ROWS", 4)
    types = con.execute("DESCRIBE t").fetchall()
    assert fold.fold_small_tables(con, ["t", "u", "empty", "big", "absent"]) == ["u", "t"]  # fewest rows first
    kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
    assert kinds == {"t": "VIEW", "u": "VIEW", "empty": "BASE TABLE", "big": "BASE TABLE", "_small_tables": "BASE TABLE"}
    assert con.execute("SELECT * FROM t").fetchall() == ROWS
    assert con.execute("DESCRIBE t").fetchall() == types
    assert con.execute("SELECT * FROM u").fetchall() == [(10, "x"), (11, "y")]
    assert con.execute("SELECT count(*) FROM _small_tables").fetchone() == (5,)
    assert con.execute("SELECT comment FROM duckdb_views() WHERE view_name = 't'").fetchone() == ("the table",)
    comments = dict(con.execute("SELECT column_name, comment FROM duckdb_columns() WHERE table_name = 't'").fetchall())
    assert comments["big"] == "an unsigned one" and comments["name"] is None
    slots = dict(con.execute("SELECT column_name, comment FROM duckdb_columns() WHERE table_name = '_small_tables'").fetchall())
    assert slots["BIGINT_0"] == "BIGINT values of u.id, t.id."


def test_nothing_to_fold_writes_nothing(con, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_ROWS", 1)
    assert fold.fold_small_tables(con, ["t", "empty"]) == []
    assert {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()} == {"t", "u", "empty", "big"}
