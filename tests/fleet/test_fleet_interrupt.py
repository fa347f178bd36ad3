"""`itertrace fleet ingest` interrupted (SIGINT) and run again: it stops with its work so far kept, and the second
run skips the captures done and finishes the rest.

The interruption is deterministic: the local cluster's workers preload (through Dask's own configuration,
DASK_DISTRIBUTED__WORKER__PRELOAD) a module that holds one chosen capture's task until a file appears that
the test never makes. The test waits until every other capture's database is there and no ingest's hidden
work is left (polling the folder against a deadline), then sends SIGINT: the held capture is the one left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from dask_procs import stop, wait_until
from fleet_captures import kineto_rank

ITERTRACE = Path(sys.executable).with_name("itertrace")
HELD = "in/server-1/rank-0.json.gz"

HOLDER = '''
import time
from pathlib import Path

import itertrace.fleet.ingest_tasks as tasks

_RELEASE = Path({release!r})
_ingest = getattr(tasks, "unwrapped_ingest", tasks.ingest_capture)  # Dask may run a preload twice in one process
tasks.unwrapped_ingest = _ingest


def ingest_capture(job):
    while job.name == {held!r} and not _RELEASE.exists():
        time.sleep(0.05)
    return _ingest(job)


tasks.ingest_capture = ingest_capture
'''


def hidden(fleet: Path) -> list[Path]:
    return list((fleet / "captures").rglob(".*"))


def databases(fleet: Path) -> list[str]:
    return sorted(p.relative_to(fleet / "captures").as_posix() for p in (fleet / "captures").rglob("*.duckdb"))


def test_interrupted_and_run_again(tmp_path):
    captures, fleet = tmp_path / "in", tmp_path / "fleet"
    names = []
    for server, ranks in (("server-0", 4), ("server-1", 2), ("server-2", 2)):
        for r in range(ranks):
            kineto_rank(captures / server / f"rank-{r}.json.gz", r, ranks, {i: 1_000 for i in range(3)})
            names.append(f"in/{server}/rank-{r}.json.gz")
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER.format(release=str(tmp_path / "never"), held=HELD))
    command = [str(ITERTRACE), "fleet", "ingest", str(captures), "--out", str(fleet), "--workers", "2"]
    env = os.environ | {"DASK_DISTRIBUTED__WORKER__PRELOAD": f'["{holder}"]'}
    with (tmp_path / "first.log").open("wb") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        others = sorted(f"{n}.duckdb" for n in names if n != HELD)
        # every other database renamed into place and its ingest's hidden work removed: only the held task runs
        wait_until(lambda: databases(fleet) == others and not hidden(fleet), "every capture but the held one ingested",
                   alive=first)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 128 + signal.SIGINT
    finally:
        stop(first)
    said = (tmp_path / "first.log").read_text()
    assert said.splitlines()[-1] == "itertrace: interrupted", said
    assert databases(fleet) == others
    assert not hidden(fleet)  # no hidden work left behind
    # The manifest holds what the command heard of before the signal: a result may still have been on its way.
    done = {r["capture"] for r in pq.read_table(fleet / "captures.parquet").to_pylist() if r["status"] == "done"}
    assert done <= {n for n in names if n != HELD}

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[-1].startswith(
        f"itertrace: fleet ingest: 8 of 8 captures in {fleet} (1 ingested, 7 done before) in ")
    assert databases(fleet) == sorted(f"{n}.duckdb" for n in names)
