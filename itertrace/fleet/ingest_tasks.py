"""`fleet ingest`: one Dask task per capture, each making the capture's database as `itertrace ingest` does.

A capture whose database is newer than its files is done already and is skipped; one that fails is a row
of the failures table with its one-line error, and the rest go on. The manifest is written when the
command ends, however it ends (an interrupted run keeps what it finished; the next run resumes).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from itertrace.errors import UserError
from itertrace.fleet.captures import Capture, PathRules
from itertrace.fleet.layout import Entry, Fleet, read_manifest, write_manifest
from itertrace.fleet.runner import TaskProgress, run_tasks


@dataclass(frozen=True)
class IngestSettings:
    """What every capture's ingest is given: `itertrace ingest`'s --memory-limit and --nsys, and DuckDB threads."""

    memory_limit: str | None = None
    nsys: str | None = None
    threads: int = 1


@dataclass(frozen=True)
class IngestJob:
    """One capture to ingest: its sources (run directory first) and its database."""

    name: str
    sources: tuple[str, ...]
    db: str
    settings: IngestSettings

    def is_done(self) -> bool:
        """Whether the capture's database exists and is newer than every file of the capture."""
        return is_done(tuple(Path(s) for s in self.sources), Path(self.db))


@dataclass(frozen=True)
class IngestOutcome:
    """What one capture's task did: its error, or the rows it wrote and the seconds it took."""

    name: str
    error: str | None
    rows: int = 0
    seconds: float | None = None
    worker: str = ""  # host:pid of the process that ran it
    found_done: bool = False  # its database was there already, newer than the capture: nothing was done


@dataclass(frozen=True)
class FleetIngest:
    """What `fleet ingest` did: captures ingested now, done before, failed; and how long it took."""

    total: int
    ingested: int
    skipped: int
    failed: int
    seconds: float


def ingest_capture(job: IngestJob) -> IngestOutcome:
    """The task: ingest one capture into its database; any error comes back as one line.

    A task Dask runs again finds the database it made done, and does nothing: Dask runs a finished task
    again where the worker holding its result died before the result was fetched."""
    from itertrace.ingest import IngestOptions, default_loaders, ingest

    started = time.monotonic()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    missing = next((s for s in job.sources if not os.path.exists(s)), None)
    if missing is not None:
        return IngestOutcome(job.name, f"{missing}: not found on worker {worker}; the workers must see the captures "
                                       "at the same paths as the machine that runs `fleet ingest`", worker=worker)
    if job.is_done():
        return IngestOutcome(job.name, None, worker=worker, found_done=True)
    options = IngestOptions(memory_limit=job.settings.memory_limit, threads=job.settings.threads)
    try:
        Path(job.db).parent.mkdir(parents=True, exist_ok=True)
        result = ingest([Path(s) for s in job.sources], job.db, loaders=default_loaders(job.settings.nsys),
                        options=options)
    except UserError as exc:
        return IngestOutcome(job.name, one_line(str(exc)), worker=worker)
    except Exception as exc:  # noqa: BLE001 - a capture that breaks the ingest fails alone
        return IngestOutcome(job.name, one_line(f"{type(exc).__name__}: {exc}"), worker=worker)
    return IngestOutcome(job.name, None, result.rows, time.monotonic() - started, worker)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else text


def is_done(sources: tuple[Path, ...], db: Path) -> bool:
    """Whether the database exists and is newer than every file of the capture's sources."""
    try:
        made = db.stat().st_mtime
    except FileNotFoundError:
        return False
    return made >= max(_newest(p) for p in sources)


def _newest(path: Path) -> float:
    """The latest modification time of `path` and, for a folder, of the files directly in it."""
    times = [path.stat().st_mtime]
    if path.is_dir():
        times += [p.stat().st_mtime for p in path.iterdir() if p.is_file()]
    return max(times)


def ingest_fleet(captures: list[Capture], fleet: Fleet, client, *, rules: PathRules = PathRules(),
                 settings: IngestSettings = IngestSettings(), progress: TaskProgress | None = None,
                 clock=time.monotonic) -> FleetIngest:
    """Ingest every capture not done yet into the fleet, a task each on `client`; update the manifest."""
    started = clock()
    entries = read_manifest(fleet)
    pending: dict[str, Entry] = {}
    jobs: list[IngestJob] = []
    skipped = 0
    for capture in captures:
        entry = Entry(capture.name, str(capture.source), str(capture.run_dir) if capture.run_dir else None, "done",
                      None, rules.rank(capture), rules.group(capture), None)
        db = fleet.database(capture.name)
        if is_done(capture.sources, db):
            before = entries.get(capture.name)
            entries[capture.name] = dataclasses.replace(entry, ingest_s=before.ingest_s if before else None)
            skipped += 1
            continue
        db.parent.mkdir(parents=True, exist_ok=True)
        pending[capture.name] = entry
        jobs.append(IngestJob(capture.name, tuple(str(s) for s in capture.sources), str(db), settings))
    progress = progress or TaskProgress("fleet ingest", 0, enabled=False)
    progress.total = len(jobs)
    if skipped:
        progress.what += f" ({skipped:,} done before)"
    failed = 0
    try:
        progress.start()
        for job, outcome in run_tasks(client, ingest_capture, jobs, lambda j, line: IngestOutcome(j.name, line)):
            error = outcome.error
            if error is None and not Path(job.db).is_file():
                error = (f"{job.db}: written on worker {outcome.worker} but not found here; the fleet's folder must "
                         "be on a file system the workers share")
            entries[job.name] = dataclasses.replace(pending[job.name], status="failed" if error else "done",
                                                    error=error, ingest_s=outcome.seconds)
            failed += error is not None
            progress.count(failed=error is not None)
    finally:
        progress.close()
        write_manifest(fleet, entries.values())
    return FleetIngest(len(captures), len(jobs) - failed, skipped, failed, clock() - started)
