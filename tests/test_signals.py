"""Ctrl-C and SIGTERM in the middle of the work: `itertrace: interrupted` (130) or `itertrace: terminated` (143),
no traceback, and nothing half-written left behind, wherever the signal lands (in Python, in a DuckDB query,
or inside the Arrow stream DuckDB is reading from Python)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from test_ingest_target import an_old_database, export

STATUS = {signal.SIGINT: (130, "itertrace: interrupted"), signal.SIGTERM: (143, "itertrace: terminated")}


@pytest.fixture(scope="module")
def big_export(tmp_path_factory) -> Path:
    """An export whose ingest takes about ten times as long as the wait before the signal (4M ranges, 5 s
    here): the signal cannot come after the work is done, whatever the machine's speed."""
    return export(tmp_path_factory.mktemp("big") / "big.arrow", rows=4_000_000)


def holds_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (the CLI installs its signal handlers before it opens anything)."""
    try:
        return any(Path(os.readlink(fd)) == path for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # a descriptor closed while we looked
        return False


def signalled(argv: list[str], signum: int, started) -> subprocess.CompletedProcess:
    """Run `itertrace argv`, send `signum` once `started(pid)` is true (and a moment more), return what it did."""
    proc = subprocess.Popen([sys.executable, "-m", "itertrace.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()  # still at work when the signal comes
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_a_source_streams_into_duckdb(big_export, tmp_path, signum):
    db = tmp_path / "trace.duckdb"
    before = an_old_database(db)
    done = signalled(["ingest", str(big_export), "--db", str(db), "--quiet"], signum,
                     lambda pid: any(p.name.endswith(".ingest") for p in tmp_path.iterdir()))
    status, line = STATUS[signum]
    assert (done.returncode, done.stderr.strip().splitlines()) == (status, [line]), done.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.duckdb"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("out", [False, True], ids=["stdout", "--out"])
def test_a_signal_while_sql_runs(tmp_path, signum, out):
    db = tmp_path / "trace.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE run_meta AS SELECT 1 AS run_id")
    # Minutes of work for a few rows: DuckDB checks for a signal between its tasks (a single long sort
    # would not hear one until it ends).
    argv = ["sql", "--db", str(db), "SELECT x FROM range(100000000000) t(x) WHERE hash(x) % 1000000007 = 3"]
    if out:
        argv += ["--format", "csv", "--out", str(tmp_path / "rows.csv")]
    done = signalled(argv, signum, lambda pid: holds_open(pid, db))
    status, line = STATUS[signum]
    assert (done.returncode, done.stderr.strip().splitlines(), done.stdout) == (status, [line], ""), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.duckdb"]
