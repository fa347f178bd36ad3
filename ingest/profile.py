"""`itertrace profile [--out DIR] -- COMMAND...`: one command from a live run to a database.

Runs COMMAND under `nsys profile` (the traces that fit the machine), imports the capture where Debian's
nsys leaves only a .qdstrm, and ingests the report together with the run directory the command wrote:
DIR/report.nsys-rep, DIR/run/ (for an `itertrace run` command that names no --out of its own) and
DIR/trace.duckdb, with nsys's and the command's output in DIR/profile.log. DIR must be new or empty;
if the command or the ingest fails, what was written there is removed again.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import duckdb

from itertrace.errors import UserError
from itertrace.ingest.api import IngestOptions, IngestResult, default_loaders, ingest
from itertrace.ingest.nsys import Nsys, find_nsys, machine_traces, profile
from itertrace.ingest.progress import Progress

REPORT_NAME = "report.nsys-rep"
RUN_NAME = "run"
DB_NAME = "trace.duckdb"
LOG_NAME = "profile.log"  # nsys's and the command's output
_PYTHON_FLAGS_WITH_VALUE = ("-W", "-X")


class CommandFailed(Exception):
    """The profiled command exited with a non-zero status; nothing was kept."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ProfileResult:
    """What `profile_command` made: the folder, report, run directory (if any), database and its ingest."""

    out: Path
    report: Path
    run_dir: Path | None
    db: Path
    traces: tuple[str, ...]
    nsys: Nsys
    ingest: IngestResult


@dataclass(frozen=True)
class RunTarget:
    """Where an `itertrace run` command will write its run directory, and the command that does so."""

    command: list[str]
    run_dir: Path


def profile_command(
    command: Sequence[str],
    out: Path | None = None,
    *,
    nsys_executable: str | Path | None = None,
    traces: Sequence[str] | None = None,
    echo: TextIO | None = None,
    progress: TextIO | None = None,
    options: IngestOptions = IngestOptions(),
) -> ProfileResult:
    """Profile `command` under nsys into the folder `out` and ingest the capture with the command's run directory.

    `echo` receives the command's output as it runs, `progress` the ingest's progress bar. If anything
    fails, `out` is removed again (or emptied, if it existed empty).
    """
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("itertrace profile: give the command to profile after --, e.g. "
                        "`itertrace profile --out prof -- .venv/bin/itertrace run --runner torch`")
    nsys = find_nsys(nsys_executable)
    command[0] = _program(command[0])
    target, existed = _target(out)
    traces = tuple(traces or machine_traces())
    try:
        run = run_target(command, target)
        report, log = target / REPORT_NAME, target / LOG_NAME
        try:
            capture = profile(run.command if run else command, report, nsys, traces=traces, log=log, echo=echo)
        except UserError as exc:
            said = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
            raise UserError(f"nsys profile of `{_shown(command)}` made no report"
                            f"{f' ({said[-1]})' if said else ''}; nothing kept in {target}") from exc
        if capture.returncode != 0:
            raise CommandFailed(f"`{_shown(command)}` exited with status {capture.returncode} under nsys profile; "
                                f"nothing kept in {target}", capture.returncode)
        sources = [report]
        run_dir = run.run_dir if run else None
        if run_dir is not None and not (run_dir / "run.json").is_file():
            print(f"itertrace: warning: `{_shown(command)}` wrote no run directory at {run_dir}; "
                  "ingesting the capture alone", file=sys.stderr)
            run_dir = None
        if run_dir is not None:
            sources.insert(0, run_dir)
            _restore_umask(run_dir)
        result = ingest(sources, target / DB_NAME, loaders=default_loaders(nsys.executable), options=options,
                        progress=Progress(progress, enabled=progress is not None))
    except BaseException:
        _discard(target, existed)
        raise
    return ProfileResult(target, report, run_dir, target / DB_NAME, traces, nsys, result)


def run_target(command: list[str], out: Path) -> RunTarget | None:
    """For an `itertrace run` command, where its run directory goes: OUT/run unless the command names an --out."""
    at = _run_subcommand(command)
    if at is None:
        return None
    for arg_index in range(at + 1, len(command)):
        arg = command[arg_index]
        if arg == "--":
            break
        if arg == "--out" and arg_index + 1 < len(command):
            return RunTarget(command, Path(command[arg_index + 1]))
        if arg.startswith("--out="):
            return RunTarget(command, Path(arg[len("--out="):]))
    return RunTarget([*command, "--out", str(out / RUN_NAME)], out / RUN_NAME)


def summary_lines(result: ProfileResult) -> list[str]:
    """A short account of what a profile made: report, run directory, database with its rows and ranges."""
    with duckdb.connect(str(result.db), read_only=True) as con:
        ranges, steps, payloads, marks, gpu_ops = con.execute("""
            SELECT (SELECT count(*) FROM nvtx_ranges),
                   count(*), count(DISTINCT int64_value),
                   (SELECT count(*) FROM nvtx_marks),
                   (SELECT count(*) FROM gpu_ops)
            FROM nvtx_ranges WHERE text = 'step' AND domain_name = 'itertrace'""").fetchone()
        run = None
        if result.run_dir is not None:
            run = con.execute("SELECT iterations, requests, runner, device, mode FROM run_meta").fetchone()
    size_mb = result.report.stat().st_size / 1e6
    lines = [f"report    {result.report} ({size_mb:.1f} MB; nsys {result.nsys.version}, traces "
             f"{','.join(result.traces)})"]
    if run is not None:
        iterations, requests, runner, device, mode = run
        lines.append(f"run       {result.run_dir} ({iterations:,} iterations, {requests:,} requests; {runner} "
                     f"runner on {device}, {mode})")
    ingested = result.ingest
    lines.append(f"database  {result.db} ({ingested.rows:,} rows in {ingested.seconds:.1f} s)")
    lines.append(f"          {ranges:,} NVTX ranges ({steps:,} itertrace step ranges over {payloads:,} iterations), "
                 f"{marks:,} marks, {gpu_ops:,} GPU operations")
    if run is not None and (steps, payloads) != (run[0], run[0]):
        lines.append(f"warning   the run log has {run[0]:,} iterations but the capture {steps:,} step ranges "
                     f"carrying {payloads:,} iteration numbers")
    lines += [f"note      {note}" for note in ingested.notes]
    return lines


def _run_subcommand(command: list[str]) -> int | None:
    """Index of `run` in `itertrace run ...` or `python -m itertrace.cli run ...`; None for other commands."""
    name = Path(command[0]).name
    i = 1
    if name.startswith("python"):
        while i < len(command) and command[i].startswith("-") and command[i] not in ("-m", "-c", "-"):
            i += 2 if command[i] in _PYTHON_FLAGS_WITH_VALUE else 1
        if i + 1 >= len(command) or command[i] != "-m" or command[i + 1] not in ("itertrace.cli", "itertrace"):
            return None
        i += 2
    elif name != "itertrace":
        return None
    return i if i < len(command) and command[i] == "run" else None


def _program(program: str) -> str:
    """`program` as a path nsys can run: as given when it holds a slash, else found on PATH or beside this Python."""
    if os.sep in program:
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise UserError(f"{program}: not an executable program")
        return program
    found = shutil.which(program)
    if found is None:
        beside = Path(sys.executable).parent / program  # e.g. the venv's itertrace when the venv is not activated
        if os.access(beside, os.X_OK) and beside.is_file():
            return str(beside)
        raise UserError(f"{program}: program not found on PATH")
    return found


def _target(out: Path | None) -> tuple[Path, bool]:
    """The folder to fill, created here unless it exists empty; and whether it existed."""
    target = Path(out) if out is not None else Path("runs") / time.strftime("profile-%Y%m%d-%H%M%S")
    existed = target.exists()
    if existed and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out {target}: already exists and is not empty; choose another directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {target}: cannot create it ({exc.strerror})")
    return target, existed


def _discard(target: Path, existed: bool) -> None:
    """Remove what a failed profile made: the folder, or its contents when it existed (empty) before."""
    if not existed:
        shutil.rmtree(target, ignore_errors=True)
        return
    for child in target.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _restore_umask(folder: Path) -> None:
    """Give the files under `folder` the modes this process's umask gives new files.

    nsys profile runs the command with umask 0, so what it writes would otherwise be writable by anyone.
    """
    mask = os.umask(0)
    os.umask(mask)
    for path in (folder, *folder.rglob("*")):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _shown(command: Sequence[str]) -> str:
    text = " ".join(command)
    return text if len(text) <= 120 else text[:117] + "..."
