"""Every real sample ingests to the tables it gave before the ingest was rewritten for speed, row for row.

The expected fingerprints (`ingest_fingerprints.json`, see `ingest_fingerprints.py`) were computed from
the databases of the earlier ingest: per table its columns, rows and an order-independent hash of
every row's values, per normalized table also one hash per column.
"""
from __future__ import annotations

import json

import pytest
from ingest_fingerprints import EXPECTED, SHARED_SAMPLES, fingerprint_sources, nsys_version, samples

RECORDED = json.loads(EXPECTED.read_text())
FOUND = samples()


def _params():
    for name in sorted(RECORDED["samples"]):
        marks = [pytest.mark.skipif(name not in FOUND, reason=f"sample {name} not found")]
        if name.startswith("sample_traces/"):
            marks.append(pytest.mark.nsys)
            marks.append(pytest.mark.skipif(
                nsys_version() != RECORDED["nsys_version"],
                reason=f"the .nsys-rep fingerprints are of nsys {RECORDED['nsys_version']}'s export"))
        else:
            marks.append(pytest.mark.shared)
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_tables_match_their_fingerprints(name, tmp_path):
    expected = RECORDED["samples"][name]
    got = fingerprint_sources(FOUND[name], tmp_path)
    assert sorted(got) == sorted(expected)
    for table, want in expected.items():
        have = got[table]
        wanted, had = want.get("column_hashes", {}), have.get("column_hashes", {})
        differ = [column for column in wanted if had.get(column) != wanted[column]]
        assert not differ, f"{table}: columns {', '.join(differ)} differ"
        assert have == want, table


def test_every_sample_in_the_repository_is_found_and_fingerprinted():
    ours = {name for name in RECORDED["samples"] if name.startswith("sample_traces/")}
    assert len(ours) == 2 and ours == {name for name in FOUND if name.startswith("sample_traces/")}


@pytest.mark.shared
@pytest.mark.skipif(not SHARED_SAMPLES.is_dir(), reason=f"real nsys exports not found at {SHARED_SAMPLES}")
def test_every_shared_sample_is_found_and_fingerprinted():
    assert set(FOUND) == set(RECORDED["samples"])  # a sample renamed or gone fails here, not skips
    assert len(RECORDED["samples"]) == 11  # 5 Arrow and 4 parquetdir exports, 2 sample traces
