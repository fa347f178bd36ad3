"""Which captures the paths given to `fleet ingest` hold, what each is named, and what its path says.

A capture is a file or folder that `itertrace ingest` takes as a trace: a PyTorch profiler trace, an Nsight
Systems report or export. A folder given is searched through (hidden entries and run directories left
out); each capture found in it is named by its path inside the folder, starting with the folder's own
name, and a file or export folder given directly by its own name. A capture is ingested with the run
directory beside it (as `itertrace profile` lays them out) where its folder holds one capture and one
run directory.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from itertrace.errors import UserError


@dataclass(frozen=True)
class Capture:
    """One capture of the fleet."""

    name: str  # e.g. "nightly/server-1/rank-0.json.gz": its path as given, "/" between folders
    source: Path  # the capture file or export folder, absolute
    run_dir: Path | None  # the run directory ingested with it

    @property
    def sources(self) -> tuple[Path, ...]:
        """What `itertrace ingest` is given for it: the run directory first, as `itertrace profile` does."""
        return (self.run_dir, self.source) if self.run_dir else (self.source,)


@dataclass(frozen=True)
class PathRules:
    """What a capture's path says about it: --rank-from and --group-from, each a regex with one group."""

    rank_from: str | None = None
    group_from: str | None = None

    def check(self) -> None:
        """A UserError for a pattern that is no regex or has not exactly one capturing group."""
        for flag, pattern in (("--rank-from", self.rank_from), ("--group-from", self.group_from)):
            if pattern is None:
                continue
            try:
                groups = re.compile(pattern).groups
            except re.error as exc:
                raise UserError(f"{flag} {pattern!r}: not a regular expression ({exc})") from None
            if groups != 1:
                raise UserError(f"{flag} {pattern!r}: needs exactly one capturing group, the "
                                f"{'rank' if flag == '--rank-from' else 'group'}; it has {groups}")

    def rank(self, capture: Capture) -> int | None:
        """The rank --rank-from reads from the capture's path; None without it or where it does not match."""
        if self.rank_from is None or not (found := re.search(self.rank_from, str(capture.source))):
            return None
        try:
            return int(found.group(1))
        except (TypeError, ValueError):
            raise UserError(f"--rank-from {self.rank_from!r}: matched {found.group(1)!r} in {capture.source}, "
                            "not an integer") from None

    def group(self, capture: Capture) -> str:
        """The capture's group key: what --group-from reads from its path, else the folder its name lies in."""
        if self.group_from is not None and (found := re.search(self.group_from, str(capture.source))):
            if found.group(1):
                return found.group(1)
        return capture.name.rpartition("/")[0] or "."


def find_captures(paths: Sequence[Path], *, skip: Path | None = None) -> list[Capture]:
    """Every capture in `paths`, in the order given (a folder's in name order); `skip` is a folder left out
    (the fleet's own, when it lies inside a folder given). A path that holds none is a UserError."""
    from itertrace.ingest import KinetoLoader, NsysLoader, RunDirLoader

    kinds = _Kinds(RunDirLoader(), NsysLoader(), KinetoLoader())
    found: list[Capture] = []
    for path in paths:
        if not path.exists():
            raise UserError(f"{path}: no such file or folder")
        path = Path(os.path.abspath(path))
        if kinds.is_capture(path):
            captures, runs = _listing(path.parent, kinds, None)
            found.append(Capture(path.name, path, _beside(captures, runs)))
        elif kinds.is_run_dir(path):
            raise UserError(f"{path}: a run directory, not a capture; give the capture (or the folder holding both)")
        elif path.is_dir():
            inside = [Capture(f"{path.name}/{c.name}", c.source, c.run_dir) for c in _walk(path, kinds, skip)]
            if not inside:
                raise UserError(f"{path}: {_none_in(path)}; expected {kinds.expected}")
            found.extend(inside)
        else:
            raise UserError(f"{path}: not a capture; expected {kinds.expected}")
    _check_names(found)
    return found


@dataclass(frozen=True)
class _Kinds:
    run: object
    nsys: object
    kineto: object

    def is_run_dir(self, path: Path) -> bool:
        return self.run.claims(path)

    def is_capture(self, path: Path) -> bool:
        """A trace file or an export folder (a run directory holds Parquet files too, and is not one)."""
        return not self.run.claims(path) and (self.nsys.claims(path) or self.kineto.claims(path))

    @property
    def expected(self) -> str:
        return f"{self.kineto.accepts}; or {self.nsys.accepts}"


def _walk(folder: Path, kinds: _Kinds, skip: Path | None, prefix: str = "") -> list[Capture]:
    """The captures under `folder`, in name order, named by their path inside it; an export folder or a run
    directory is not entered."""
    captures, runs = _listing(folder, kinds, skip)
    run_dir = _beside(captures, runs)
    out = [Capture(prefix + p.name, p, run_dir) for p in captures]
    taken = {*captures, *runs}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.is_dir() and not entry.is_symlink() and entry not in taken and not entry.name.startswith(".") \
                and not (skip is not None and entry.resolve() == skip.resolve()):
            out.extend(_walk(entry, kinds, skip, f"{prefix}{entry.name}/"))
    return sorted(out, key=lambda c: c.name)


def _listing(folder: Path, kinds: _Kinds, skip: Path | None) -> tuple[list[Path], list[Path]]:
    """The captures and the run directories directly in `folder`, in name order."""
    captures, runs = [], []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or (skip is not None and entry.resolve() == skip.resolve()):
            continue
        if kinds.is_run_dir(entry):
            runs.append(entry)
        elif kinds.is_capture(entry):
            captures.append(entry)
    return captures, runs


def _beside(captures: list[Path], runs: list[Path]) -> Path | None:
    """The run directory that goes with the captures of a folder: its only one, where it holds one capture."""
    return runs[0] if len(captures) == 1 and len(runs) == 1 else None


def _none_in(folder: Path) -> str:
    files = sum(len(names) for _, _, names in os.walk(folder))
    if not files:
        return "empty folder: no captures in it"
    return f"no captures in this folder ({files:,} file{'s' if files != 1 else ''}, none a trace)"


def _check_names(captures: list[Capture]) -> None:
    seen: dict[str, Capture] = {}
    for capture in captures:
        if (earlier := seen.setdefault(capture.name, capture)) is not capture:
            if earlier.source == capture.source:
                raise UserError(f"{capture.source}: given twice")
            raise UserError(f"two captures are named {capture.name}: {earlier.source} and {capture.source}; give "
                            "the folders above them instead, so that their names differ")
