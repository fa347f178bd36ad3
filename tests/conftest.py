"""Fixtures shared by several test files: the sample captures, ingested once per session, and an empty
capture-shaped database for the SQL diff tests."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings
from query_fixtures import TraceDB

# The property tests draw the same examples on every run (a seed per test), so that a run on a fresh
# machine cannot fail where the last one passed. HYPOTHESIS_PROFILE=explore draws new ones, to hunt.
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@pytest.fixture(scope="session")
def sample_dbs(tmp_path_factory) -> dict[str, Path]:
    """{'static': db, 'continuous': db}: each worked-example sample's run log and capture in one database."""
    if shutil.which("nsys") is None:
        pytest.skip("nsys (Nsight Systems) is not installed: the sample reports cannot be exported")
    from itertrace.ingest import ingest
    folder = tmp_path_factory.mktemp("samples")
    dbs = {}
    for mode in ("static", "continuous"):
        sample = SAMPLES / f"worked-example-{mode}"
        dbs[mode] = folder / f"{mode}.duckdb"
        ingest([sample / "run", sample / "report.nsys-rep"], dbs[mode])
    return dbs


@pytest.fixture(scope="module")
def trace():
    """A TraceDB for the SQL diff tests of one module: each test loads the rows it needs (TraceDB.load)."""
    with TraceDB() as db:
        yield db
