"""The ranges' nesting runs on a second connection while the ingest builds the other tables: what it
raises fails the ingest, and a failed ingest stops it; either way nothing is left behind and no thread
of it runs on."""
from __future__ import annotations

import threading
import time

import duckdb
import pytest

from itertrace.ingest import background, normalize
from itertrace.ingest.api import ingest
from test_ingest_formats import export_tables, write_arrow


def side_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "itertrace-side-job"]


def test_the_nesting_reads_the_arrow_export_on_its_own_connection(tmp_path):
    # The export's Arrow tables are registered on the ingest's connection; the second one needs them too.
    source = write_arrow(export_tables(), tmp_path / "export.arrow")
    ingest([source], tmp_path / "trace.duckdb")
    with duckdb.connect(str(tmp_path / "trace.duckdb"), read_only=True) as con:
        ranges = con.execute("SELECT range_id, text, depth, parent_range_id FROM nvtx_ranges ORDER BY range_id").fetchall()
    assert ranges == [(1, "step", 0, None), (2, "forward", 1, 1), (3, "bad \ufffd utf8", 2, 2)]
    assert not side_threads()


def test_an_error_in_the_nesting_fails_the_ingest(tmp_path, monkeypatch):
    source = write_arrow(export_tables(), tmp_path / "export.arrow")

    def broken(con, table, cancel):
        raise ValueError("the nesting broke")

    monkeypatch.setattr(normalize, "create_range_nesting", broken)
    with pytest.raises(ValueError, match="the nesting broke"):
        ingest([source], tmp_path / "trace.duckdb")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.arrow"]
    assert not side_threads()


def test_a_failing_statement_stops_the_nesting_between_its_steps(tmp_path, monkeypatch):
    source = write_arrow(export_tables(), tmp_path / "export.arrow")
    started, ended = threading.Event(), []

    def endless(con, table, cancel):  # a nesting of many pieces, checking between them
        started.set()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                background.check(cancel)
                time.sleep(0.005)
            ended.append("ran out")
        except background.Cancelled:
            ended.append("cancelled")

    real = normalize._execute

    def failing(con, statement, made, makers):
        if "INSERT INTO _cuda_api_rows" in statement:  # built while the nesting runs
            assert started.wait(30)
            raise RuntimeError("a statement failed")
        real(con, statement, made, makers)

    monkeypatch.setattr(normalize, "create_range_nesting", endless)
    monkeypatch.setattr(normalize, "_execute", failing)
    with pytest.raises(RuntimeError, match="a statement failed"):
        ingest([source], tmp_path / "trace.duckdb")
    assert ended == ["cancelled"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.arrow"]
    assert not side_threads()
