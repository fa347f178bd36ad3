"""A fleet's folder: where each capture's database, the manifest and the summary go, and who holds it.

```
FLEET/
  captures.parquet        the manifest: one row per capture given to `fleet ingest`, its latest state
  failures.parquet        the captures whose latest ingest failed, each with its one-line error
  captures/NAME.duckdb    each capture's database, made as `itertrace ingest` makes it
  summary/                `fleet summary`'s Parquet files and fleet.duckdb (summary.py)
  reports/NAME.html       each capture's own report (`itertrace report --fleet`)
```
A capture's NAME is its path as given (a file's name, or a path inside a folder given, starting with that
folder's name), so NAME may hold folders. Every file is written under a hidden name and renamed into
place; one fleet command at a time holds the folder (a lock the system drops when the process dies).
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from itertrace.errors import UserError, no_folder_for
from itertrace.targets import hidden_file

MANIFEST = "captures.parquet"
FAILURES = "failures.parquet"
_LOCK = ".lock"

# The manifest's columns, with what each holds (docs/fleet.md lists them too).
MANIFEST_COLUMNS = {
    "capture": "The capture's name: its path as given (a file's name, or its path inside a folder given).",
    "source": "The capture file or export folder, as an absolute path.",
    "run_dir": "The run directory ingested with it (the one beside it), or NULL.",
    "status": "'done' (its database is in captures/) or 'failed' (see error).",
    "error": "Why its ingest failed, in one line; NULL when done.",
    "path_rank": "The rank --rank-from read from its path; NULL without --rank-from or where it did not match.",
    "group_key": "The group --group-from read from its path, else the folder its name lies in.",
    "ingest_s": "Seconds its ingest took; NULL when an earlier run made its database.",
}


_TYPES = {"capture": pa.string(), "source": pa.string(), "run_dir": pa.string(), "status": pa.string(),
          "error": pa.string(), "path_rank": pa.int64(), "group_key": pa.string(), "ingest_s": pa.float64()}
MANIFEST_SCHEMA = pa.schema([pa.field(name, kind, metadata={"doc": MANIFEST_COLUMNS[name]})
                             for name, kind in _TYPES.items()])


@dataclass(frozen=True)
class Entry:
    """One capture's row of the manifest."""

    capture: str
    source: str
    run_dir: str | None
    status: str  # "done" or "failed"
    error: str | None
    path_rank: int | None
    group_key: str
    ingest_s: float | None


@dataclass(frozen=True)
class Fleet:
    """The folder of a fleet and the paths inside it."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def failures(self) -> Path:
        return self.root / FAILURES

    @property
    def summary(self) -> Path:
        return self.root / "summary"

    def database(self, capture: str) -> Path:
        """The database of the capture named `capture`."""
        return self.root / "captures" / f"{capture}.duckdb"

    def report(self, capture: str) -> Path:
        """The report page of the capture named `capture`."""
        return self.root / "reports" / f"{capture}.html"


def new_or_existing(path: Path) -> Fleet:
    """The fleet at `path` for `fleet ingest --out`: a fleet already, or a new or empty folder (made here)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {path}: is a file; --out names the fleet's folder")
    if path.is_dir() and not (path / MANIFEST).is_file() and any(path.iterdir()):
        raise UserError(f"--out {path}: holds files that are not a fleet's (no {MANIFEST}); give a new or empty "
                        "folder, or the folder of a fleet to add to")
    if not path.is_dir():
        if why := no_folder_for(path):
            raise UserError(f"--out {path}: {why}")
        path.mkdir()
    return Fleet(path)


def existing(path: Path) -> Fleet:
    """The fleet at `path`, which `fleet ingest` made."""
    if not path.is_dir():
        raise UserError(f"{path}: no such fleet folder (make one with `itertrace fleet ingest CAPTURE... --out {path}`)")
    if not (path / MANIFEST).is_file():
        raise UserError(f"{path}: not a fleet (no {MANIFEST}; `itertrace fleet ingest CAPTURE... --out {path}` "
                        "makes one)")
    return Fleet(path)


@contextmanager
def held(fleet: Fleet) -> Iterator[None]:
    """Hold the fleet's folder for this command; a second fleet command on it is refused in one line."""
    fd = os.open(fleet.root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise UserError(f"{fleet.root}: another fleet command is at work on it (PID {holder}); wait for it "
                            "to end") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the lock


def read_manifest(fleet: Fleet) -> dict[str, Entry]:
    """The manifest's entries by capture name; none for a new fleet."""
    if not fleet.manifest.is_file():
        return {}
    rows = pq.read_table(fleet.manifest).to_pylist()
    return {row["capture"]: Entry(**{f.name: row.get(f.name) for f in dataclasses.fields(Entry)}) for row in rows}


def write_manifest(fleet: Fleet, entries: Iterable[Entry]) -> None:
    """Write the manifest and the failures table from `entries`, each under a hidden name renamed into place."""
    rows = sorted((dataclasses.asdict(e) for e in entries), key=lambda row: row["capture"])
    _write(fleet.manifest, pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA))
    failed = [{"capture": r["capture"], "source": r["source"], "error": r["error"]} for r in rows
              if r["status"] == "failed"]
    _write(fleet.failures, pa.Table.from_pylist(failed, schema=FAILURES_SCHEMA))


FAILURES_SCHEMA = pa.schema([pa.field("capture", pa.string()), pa.field("source", pa.string()),
                             pa.field("error", pa.string())])


def _write(path: Path, table: pa.Table) -> None:
    tmp = hidden_file(path, "tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
