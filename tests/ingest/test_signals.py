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


# `itertrace ingest` that sends itself a signal at a moment chosen exactly, whatever the machine's speed:
# - stream:N, as the Arrow stream Python feeds DuckDB hands over its Nth batch (a run directory's tables),
#   inside DuckDB's scan, on the main thread or one of DuckDB's;
# - phase:N, as the ingest of an export starts its Nth phase (plain Python on the main thread);
# - nesting:start / nesting:end, from the thread that nests the ranges, once the ingest waits for it,
#   before and after its work; nesting:meanwhile, from that thread at its start, while the ingest runs
#   its other statements.
_SIGNAL_AT = """
import os, sys, threading
from itertrace import cli
from itertrace.ingest import background, normalize
from itertrace.ingest.progress import Progress

moment, signum = sys.argv[1], int(sys.argv[2])
kind, _, at = moment.partition(":")
count = 0

def signal_at(wanted):
    global count
    if kind == wanted:
        count += 1
        if count == int(at):
            os.kill(os.getpid(), signum)

advance, phase = Progress.advance, Progress.phase
Progress.advance = lambda self, rows, label: (advance(self, rows, label), signal_at("stream"))
Progress.phase = lambda self, label: (phase(self, label), signal_at("phase"))

waiting, wait, nest = threading.Event(), background.SideJob.wait, normalize.create_range_nesting

def wait_noted(self):
    waiting.set()
    wait(self)

def nest_then_signal(con, table, cancel):
    if at == "start" or at == "end":
        waiting.wait()
    if at != "end":
        os.kill(os.getpid(), signum)
    nest(con, table, cancel)
    if at == "end":
        os.kill(os.getpid(), signum)

if kind == "nesting":
    background.SideJob.wait = wait_noted
    normalize.create_range_nesting = nest_then_signal
sys.exit(cli.main(sys.argv[3:]))
"""
_MOMENTS = ["stream:1", "stream:10", "stream:18", "phase:1", "phase:5", "phase:8", "phase:10", "nesting:start",
            "nesting:end", "nesting:meanwhile"]


@pytest.fixture(scope="module")
def moment_sources(tmp_path_factory) -> dict[str, Path]:
    """A run directory whose tables stream in 18 batches (iterations 1, events 16, requests 1) and an export
    whose ingest has 10 phases."""
    folder = tmp_path_factory.mktemp("moments")
    run = folder / "run"
    subprocess.run([sys.executable, "-m", "itertrace.cli", "run", "--workload", "synthetic", "--num-requests", "4000",
                    "--output-len", "256", "--rate", "200", "--out", str(run)], check=True, capture_output=True)
    return {"stream": run, "phase": export(folder / "export.arrow", rows=1_000_000),
            "nesting": export(folder / "nesting.arrow", rows=1_000_000)}


@pytest.mark.slow
@pytest.mark.parametrize("moment", _MOMENTS)
def test_a_signal_at_any_moment_of_the_ingest(moment_sources, tmp_path, moment):
    """Wherever the signal's handler runs (inside a scan that calls back into Python, in plain Python, while
    the ingest waits for a thread), the command stops with the signal's status and leaves nothing; it does
    not abort (as it did when a signal broke into the wait for the nesting thread, which then ran on
    inside DuckDB while Python shut down)."""
    signum = (signal.SIGTERM, signal.SIGINT)[_MOMENTS.index(moment) % 2]
    db = tmp_path / "trace.duckdb"
    before = an_old_database(db)
    source = moment_sources[moment.partition(":")[0]]
    done = subprocess.run([sys.executable, "-c", _SIGNAL_AT, moment, str(int(signum)), "ingest", str(source), "--db",
                           str(db), "--quiet"], capture_output=True, text=True, timeout=600)
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
