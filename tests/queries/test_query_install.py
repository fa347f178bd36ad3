"""A statement gets the library's views it reads, created on first use (queries.library): each alone on a fresh
connection gives the rows it gives with the whole library created, whichever way the statement names it."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from engine_captures import vllm
from itertrace.cli import main
from itertrace.queries import QueryDB
from itertrace.queries.catalog import definitions
from itertrace.queries.library import available
from query_fixtures import sorted_rows


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A database as `itertrace ingest` makes it, of a vLLM-shaped capture with GPU work."""
    folder = tmp_path_factory.mktemp("capture")
    db = folder / "trace.duckdb"
    vllm().capture.write(folder / "export")
    assert main(["ingest", str(folder / "export"), "--db", str(db), "--quiet"]) == 0
    return db


@pytest.fixture(scope="module")
def whole(capture):
    """The database with every view of the library created."""
    with QueryDB(capture) as db:
        db.need(definitions())
        yield db


def test_select_1_creates_nothing_and_chooses_no_mapping(capture):
    with QueryDB(capture) as db:
        assert db.sql("SELECT 1 AS one").to_pylist() == [{"one": 1}]
        assert db.installed == set()
        assert not db.session.execute("SELECT * FROM duckdb_variables() WHERE name = 'preset'").fetchall()


@pytest.mark.slow
def test_each_view_alone_binds_to_the_columns_it_has_with_the_whole_library(capture, whole):
    for d in definitions().values():
        if d.kind != "VIEW" or not available(d.name, whole.missing):
            continue
        with QueryDB(capture) as db:
            db.need([d.name])
            assert d.name in db.installed
            columns = db.session.sql(f"SELECT * FROM {d.name} LIMIT 0").columns  # binds with only what it reads
        assert columns == whole.session.sql(f"SELECT * FROM {d.name} LIMIT 0").columns, d.name


@pytest.mark.parametrize("name", ["gpu_time_summary", "host_gaps_by_phase"])
def test_a_deep_query_alone_gives_the_rows_it_gives_with_the_whole_library(capture, whole, name):
    with QueryDB(capture) as db:
        rows = sorted_rows(db.query(name))
    assert rows and rows == sorted_rows(whole.query(name))


def test_a_view_deep_in_the_chain_named_in_any_case_on_a_fresh_command(capture, whole, tmp_path, capsys):
    expected = whole.sql("SELECT count(*) AS n FROM _host_activity_won").to_pylist()[0]["n"]
    assert expected > 0
    db = tmp_path / "copy.duckdb"  # the command opens it with settings of its own
    db.write_bytes(capture.read_bytes())
    assert main(["sql", "--db", str(db), "--format", "csv", "SELECT count(*) AS n FROM _HOST_ACTIVITY_WON"]) == 0
    assert capsys.readouterr().out.split() == ["n", str(expected)]


def test_a_view_named_only_in_parts_of_a_string_is_created_when_binding_misses_it(capture, whole):
    with QueryDB(capture) as db:
        rows = db.sql("SELECT count(*) AS n FROM query_table('host_' || 'gaps')").to_pylist()
        assert "host_gaps" in db.installed
    assert rows == whole.sql("SELECT count(*) AS n FROM host_gaps").to_pylist()


def test_the_databases_own_views_read_the_library_not_its_stored_copies(capture, whole, tmp_path):
    db = tmp_path / "sent.duckdb"
    db.write_bytes(capture.read_bytes())
    with duckdb.connect(str(db)) as con:  # a stale stored host_gaps, and a view of the owner's over it
        con.execute("CREATE VIEW host_gaps AS SELECT 42 AS gap_ns")
        con.execute("CREATE VIEW mine WITH (DEFER_BINDING) AS SELECT count(*) AS n FROM host_gaps")
    with QueryDB(db) as opened:
        assert opened.sql("SELECT * FROM mine").to_pylist() == whole.sql("SELECT count(*) AS n FROM host_gaps").to_pylist()
