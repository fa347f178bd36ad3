"""Fixtures of the ingest tests."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest


@pytest.fixture
def target(tmp_path) -> Path:
    """Where the database would go; holds an older database that a failed ingest must leave alone, and
    nothing else may be left beside it (no temporary file)."""
    db = tmp_path / "out" / "trace.duckdb"
    db.parent.mkdir()
    with duckdb.connect(str(db)) as con:  # --db replaces only a DuckDB database
        con.execute("CREATE TABLE earlier AS SELECT 1 AS x")
    before = db.read_bytes()
    yield db
    assert db.read_bytes() == before
    assert sorted(p.name for p in db.parent.iterdir()) == ["trace.duckdb"]
