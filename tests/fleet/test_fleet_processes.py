"""`itertrace fleet` on a real cluster: `dask scheduler` and two `dask worker` processes on localhost, one worker
killed during the run.

The kill is deterministic: the workers preload a module that wraps the ingest task, and the first task to
claim a marker file (by removing it) for one chosen capture kills its own worker process with SIGKILL; Dask
reschedules the task on a worker that lives, and the marker is gone then. Dask also runs again the tasks
that had finished on the dead worker (their results died with it); those find their database made and
ingest nothing. The wrapper logs each ingest that made a database, so the test sees how often each
capture was ingested.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from dask_procs import dask_cluster
from fleet_captures import kineto_rank

from itertrace.cli import main
from itertrace.fleet import Fleet
from itertrace.ingest import ingest

STEPS = {r: {i: 2_000 + (1_500 if (r, i) == (2, 3) else 0) for i in range(1, 6)} for r in range(4)}
VICTIM = "in/server-0/rank-2.json.gz"

KILLER = '''
import os
import signal
from pathlib import Path

import itertrace.fleet.ingest_tasks as tasks

_MARK = Path({mark!r})
_LOG = Path({log!r})
_ingest = getattr(tasks, "unwrapped_ingest", tasks.ingest_capture)  # Dask may run a preload twice in one process
tasks.unwrapped_ingest = _ingest


def ingest_capture(job):
    if job.name == {victim!r}:
        try:
            _MARK.unlink()  # one process only removes it: that one dies
        except FileNotFoundError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    outcome = _ingest(job)
    if not outcome.found_done:  # Dask runs a task again whose result died with its worker: that one ingests nothing
        with open(_LOG, "a") as log:
            log.write(job.name + "\\n")
    return outcome


tasks.ingest_capture = ingest_capture
'''


def contents(db: Path) -> dict[str, list]:
    """Every table's rows, sorted, by schema and name."""
    with duckdb.connect(str(db), read_only=True) as con:
        names = con.execute("SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
        return {f"{s}.{t}": con.execute(f'SELECT * FROM {s}."{t}" ORDER BY ALL').fetchall() for s, t in names}


@pytest.fixture
def captures(tmp_path) -> Path:
    folder = tmp_path / "in"
    for r, steps in STEPS.items():
        kineto_rank(folder / "server-0" / f"rank-{r}.json.gz", r, 4, steps)
    for r in range(2):
        kineto_rank(folder / "server-1" / f"rank-{r}.json.gz", r, 2, STEPS[r])
    return folder


def test_a_worker_killed_during_the_run(tmp_path, captures, capsys):
    mark, log = tmp_path / "kill-once", tmp_path / "ingested.log"
    mark.touch()
    preload = tmp_path / "killer.py"
    preload.write_text(KILLER.format(mark=str(mark), log=str(log), victim=VICTIM))
    fleet = Fleet(tmp_path / "fleet")
    with dask_cluster(tmp_path / "dask", workers=2, preload=preload) as address:
        assert main(["fleet", "ingest", str(captures), "--out", str(fleet.root), "--scheduler", address]) == 0
        assert capsys.readouterr().err.splitlines()[-1].startswith(
            f"itertrace: fleet ingest: 6 of 6 captures in {fleet.root} (6 ingested, 0 done before) in ")
        assert not mark.exists()  # the victim's first task killed its worker
        names = sorted(f"in/server-0/rank-{r}.json.gz" for r in range(4)) + \
            sorted(f"in/server-1/rank-{r}.json.gz" for r in range(2))
        assert Counter(log.read_text().split()) == Counter(names)  # each capture ingested once
        assert sorted(p.relative_to(fleet.root / "captures").as_posix()
                      for p in (fleet.root / "captures").rglob("*")) == \
            ["in", "in/server-0", *[f"{n}.duckdb" for n in names[:4]], "in/server-1",
             *[f"{n}.duckdb" for n in names[4:]]]  # nothing else: no leftovers of the killed ingest
        for name in names:
            alone = tmp_path / "alone" / f"{name}.duckdb"
            alone.parent.mkdir(parents=True, exist_ok=True)
            ingest([captures.parent / name], alone)
            assert contents(fleet.database(name)) == contents(alone), name

        assert main(["fleet", "summary", str(fleet.root), "--scheduler", address, "--quiet"]) == 0
    with duckdb.connect(str(fleet.summary / "fleet.duckdb"), read_only=True) as con:
        assert con.execute("""SELECT iteration, skew_ns, straggler_rank FROM fleet_skew
                              WHERE "group" = 'in/server-0' AND skew_ns > 0""").fetchall() == [(3, 1_500_000, 2)]
        assert con.execute("SELECT count(*) FROM fleet_skew WHERE \"group\" = 'in/server-1'").fetchall() == [(5,)]


def test_a_local_cluster_is_left_for_the_address_given(tmp_path, captures, capsys):
    """With --scheduler, the tasks run on that cluster's workers, not on a cluster of the command's own."""
    log = tmp_path / "ingested.log"
    preload = tmp_path / "logger.py"
    preload.write_text(KILLER.format(mark=str(tmp_path / "never"), log=str(log), victim=""))
    with dask_cluster(tmp_path / "dask", workers=1, preload=preload) as address:
        assert main(["fleet", "ingest", str(captures / "server-1"), "--out", str(tmp_path / "fleet"),
                     "--scheduler", address, "--quiet"]) == 0
    assert sorted(log.read_text().split()) == ["server-1/rank-0.json.gz", "server-1/rank-1.json.gz"]
    assert os.path.isfile(tmp_path / "fleet" / "captures" / "server-1" / "rank-0.json.gz.duckdb")
