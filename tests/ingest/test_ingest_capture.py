"""A real capture made here: a Python program's NVTX ranges under `nsys profile`, ingested from the .nsys-rep."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import duckdb
import pytest

from itertrace.errors import UserError
from itertrace.ingest import ingest
from itertrace.ingest.nsys import NsysVersion, find_nsys, profile, report_version

NEWER_REPORT = (Path(__file__).resolve().parents[2].parent / "shared" / "nsys_samples" / "newer_nsys_rep"
                / "pytorch_lm_nsys2026.1.nsys-rep")
needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys (Nsight Systems) is not installed")

PROGRAM = """
import json, os, sys, threading
import nvtx

for i in range(3):
    nvtx.push_range("step", domain="itertrace", payload=i)
    nvtx.push_range("schedule", domain="itertrace")
    nvtx.pop_range(domain="itertrace")
    nvtx.push_range("forward", domain="itertrace")
    nvtx.push_range("attention", domain="itertrace", payload=100 + i)
    nvtx.pop_range(domain="itertrace")
    nvtx.pop_range(domain="itertrace")
    nvtx.mark("arrive", domain="itertrace", payload=1000 + i)
    nvtx.pop_range(domain="itertrace")
with open(sys.argv[1], "w") as f:
    json.dump({"pid": os.getpid(), "tid": threading.get_native_id()}, f)
"""


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """(report, ids of the profiled process and thread) from one `nsys profile` run."""
    out = tmp_path_factory.mktemp("capture")
    (out / "program.py").write_text(PROGRAM)
    command = [sys.executable, str(out / "program.py"), str(out / "ids.json")]
    done = profile(command, out / "program.nsys-rep", find_nsys(), traces=("nvtx", "osrt"), log=out / "nsys.log")
    assert done.returncode == 0, (out / "nsys.log").read_text()
    return done.report, json.loads((out / "ids.json").read_text())


@pytest.mark.nsys
@needs_nsys
def test_capture_leaves_a_report(capture):
    report, _ = capture
    assert report.is_file() and report.suffix == ".nsys-rep"
    assert not report.with_suffix(".qdstrm").exists()


@pytest.mark.nsys
@needs_nsys
def test_ranges_payloads_and_nesting_arrive_exactly(capture, tmp_path):
    report, ids = capture
    db = tmp_path / "trace.duckdb"
    ingest([report], db)
    with duckdb.connect(str(db), read_only=True) as con:
        ranges = con.execute("""
            SELECT r.text, r.depth, p.text, r.int64_value, r.domain_name, r.pid, r.tid, r.dur_ns > 0
            FROM nvtx_ranges r LEFT JOIN nvtx_ranges p ON p.range_id = r.parent_range_id
            ORDER BY r.range_id""").fetchall()
        marks = con.execute("SELECT text, int64_value, domain_name, pid, tid FROM nvtx_marks ORDER BY mark_id").fetchall()
        thread_name = con.execute("SELECT name FROM threads WHERE tid = ?", [ids["tid"]]).fetchone()[0]
        source_kind, version = con.execute("SELECT source_kind, nsys_version FROM capture_meta").fetchone()
    pid, tid = ids["pid"], ids["tid"]
    expected = []
    for i in range(3):
        expected += [("step", 0, None, i, "itertrace", pid, tid, True),
                     ("schedule", 1, "step", None, "itertrace", pid, tid, True),
                     ("forward", 1, "step", None, "itertrace", pid, tid, True),
                     ("attention", 2, "forward", 100 + i, "itertrace", pid, tid, True)]
    assert ranges == expected
    assert marks == [("arrive", 1000 + i, "itertrace", pid, tid) for i in range(3)]
    assert thread_name
    assert source_kind == "nsys-rep" and NsysVersion.parse(version) == find_nsys().version


@pytest.mark.nsys
@needs_nsys
def test_report_ingests_to_the_same_database_twice(capture, tmp_path):
    report, _ = capture
    tables = []
    for name in ("one.duckdb", "two.duckdb"):
        ingest([report], tmp_path / name)
        with duckdb.connect(str(tmp_path / name), read_only=True) as con:
            names = con.execute("SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
            tables.append({t: con.execute(f'SELECT * FROM {s}."{t}" ORDER BY ALL').fetchall() for s, t in names})
    assert tables[0] == tables[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.duckdb", "two.duckdb"]  # the export was removed


@pytest.mark.nsys
@needs_nsys
def test_report_headers_tell_versions(capture):
    report, _ = capture
    assert report_version(report) is None  # nsys 2022.4 stamps only a format number
    if NEWER_REPORT.is_file():
        assert report_version(NEWER_REPORT) == NsysVersion(2026, 1, 2)


def test_missing_nsys_says_how_to_install_it(tmp_path):
    with pytest.raises(UserError) as error:
        find_nsys(tmp_path / "no" / "nsys")
    assert "apt-get install" in str(error.value) and "nsight-systems-target nsight-systems" in str(error.value)
