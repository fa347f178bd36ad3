"""The Nsight Systems command line: find it, read versions, capture a command, export a report to Arrow.

Debian's nsys (bookworm non-free) hides its importer from `nsys profile`, which then leaves only a
.qdstrm; `profile` runs QdstrmImporter itself in that case and removes the .qdstrm. Without `log`,
nsys's and the profiled command's output go to this process's stdout and stderr.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from itertrace.errors import UserError

INSTALL_HINT = (
    "install Nsight Systems: on Debian bookworm add the non-free component to an apt source "
    "(Components: main contrib non-free), then `apt-get update && apt-get install -y "
    "--no-install-recommends nsight-systems-target nsight-systems`; elsewhere install NVIDIA's "
    "Nsight Systems CLI"
)
# Where nsys lives when it is not on PATH: NVIDIA's installers and the CUDA toolkit.
_KNOWN_LOCATIONS = ("/usr/local/cuda/bin/nsys", "/opt/nvidia/nsight-systems/*/bin/nsys")
_DEBIAN_IMPORTER = "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter"
_REPORT_MAGIC = b"NVIDIA Tegra Profiler Report "
_REPORT_VERSION = re.compile(rb"(\d{4})@(\d+)@(\d+)")
_CPU_TRACES = ("nvtx", "osrt")
# What Debian's nsys says when it cannot import its own capture, and the .qdstrm it leaves instead.
_IMPORTER_NOISE = re.compile(r"Importer error status:|Unable to retrieve the importer version|Generating '.*\.qdstrm'|"
                             r"\s+\S+\.qdstrm\s*$")
_GENERATED = re.compile(r"Generated:\s*$")
_QDSTRM_PATH = re.compile(r"\s+\S+\.qdstrm\s*$")
# How long profile waits for nsys's agent to finish writing a capture once nsys itself has ended.
AGENT_TIMEOUT_S = 120.0
# No CPU sampling or context-switch tracing: these machines refuse them and the NVTX traces need neither.
_QUIET_FLAGS = ("--sample=none", "--cpuctxsw=none")


@dataclass(frozen=True, order=True)
class NsysVersion:
    """An Nsight Systems release: year, release within the year, patch (2022.4.2)."""

    year: int
    release: int
    patch: int

    def __str__(self) -> str:
        return f"{self.year}.{self.release}.{self.patch}"

    @classmethod
    def parse(cls, text: str) -> NsysVersion | None:
        """The first YYYY.R.P in `text` (e.g. `nsys --version` output), or None."""
        found = re.search(r"(\d{4})\.(\d+)\.(\d+)", text)
        return cls(*map(int, found.groups())) if found else None


@dataclass(frozen=True)
class Nsys:
    """An installed nsys: its executable and version."""

    executable: Path
    version: NsysVersion

    def importer(self) -> Path | None:
        """QdstrmImporter of this nsys installation (which Debian's layout hides from `nsys profile`), if any.

        Looks in `<root>/host-linux-x64/` for each `<root>/<dir>/nsys` along the executable's chain of
        symbolic links (Debian: /usr/bin/nsys -> /usr/lib/nsight-systems/bin/nsys -> ...).
        """
        path, seen = self.executable, set()
        while path not in seen:
            seen.add(path)
            candidate = path.parent.parent / "host-linux-x64" / "QdstrmImporter"
            if candidate.is_file():
                return Path(os.path.normpath(candidate))
            if not path.is_symlink():
                break
            path = path.parent / os.readlink(path)
        fallback = Path(_DEBIAN_IMPORTER)
        return fallback if fallback.is_file() else None


@dataclass(frozen=True)
class Capture:
    """A finished `nsys profile` run: the report it made and the profiled command's exit status."""

    report: Path
    returncode: int


def find_nsys(executable: str | Path | None = None) -> Nsys:
    """The nsys at `executable`, else on PATH, else in NVIDIA's usual places; UserError saying how to install it."""
    path = _locate(executable)
    if path is None:
        where = f"{executable} is not an executable" if executable else "nsys is not on PATH"
        raise UserError(f"Nsight Systems not found ({where}); {INSTALL_HINT}")
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{path}: cannot run `nsys --version` ({exc})")
    version = NsysVersion.parse(out.stdout + out.stderr)
    if version is None:
        raise UserError(f"{path}: `nsys --version` printed no version ({(out.stdout + out.stderr).strip()[:80]!r})")
    return Nsys(path, version)


def report_version(report: Path) -> NsysVersion | None:
    """The nsys version stamped in a .nsys-rep header; None for headers that carry none (nsys 2022 and older)."""
    if report.stat().st_size == 0:
        raise UserError(f"{report}: empty file, not an Nsight Systems report")
    with open(report, "rb") as f:
        head = f.read(256)
    if not head.startswith(_REPORT_MAGIC):
        raise UserError(f"{report}: not an Nsight Systems report (no 'NVIDIA Tegra Profiler Report' header)")
    found = _REPORT_VERSION.match(head, len(_REPORT_MAGIC))
    return NsysVersion(*map(int, found.groups())) if found else None


def check_report(report: Path, nsys: Nsys) -> None:
    """UserError when `report` is empty, not a report, or written by an nsys newer than `nsys`."""
    written_by = report_version(report)
    if written_by is not None and written_by > nsys.version:
        raise UserError(
            f"{report}: written by Nsight Systems {written_by}, newer than the installed {nsys.version} "
            f"({nsys.executable}), which cannot read it; export it with nsys {written_by} or newer "
            f"(`nsys export --type arrow -o {report.with_suffix('.arrow').name} {report.name}`) and ingest the "
            f".arrow file, or install Nsight Systems {written_by} or newer"
        )


def export_arrow(report: Path, out: Path, nsys: Nsys) -> Path:
    """Export `report` to one Arrow file at `out` (concatenated IPC streams) and return `out`."""
    check_report(report, nsys)
    command = [str(nsys.executable), "export", "--type", "arrow", "--force-overwrite", "true",
               "--quiet", "true", "--output", str(out), str(report.resolve())]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        said = (done.stderr + done.stdout).strip().splitlines()
        raise UserError(f"{report}: `nsys export --type arrow` failed ({said[-1] if said else f'exit {done.returncode}'})")
    return out


def machine_traces(dev: Path = Path("/dev")) -> tuple[str, ...]:
    """The `--trace` APIs that fit this machine: NVTX and OS runtime, plus CUDA where an NVIDIA GPU is present.

    A GPU shows as a numbered device node (/dev/nvidia0, ...); /dev/nvidiactl and nvidia-smi alone do not
    mean one (machines and containers without a GPU may have the driver's control node or tools).
    """
    has_gpu = any(node.name[len("nvidia"):].isdigit() for node in dev.glob("nvidia[0-9]*"))
    return (*_CPU_TRACES, "cuda") if has_gpu else _CPU_TRACES


def profile(
    command: Sequence[str],
    report: Path,
    nsys: Nsys,
    *,
    traces: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    echo: TextIO | None = None,
    timeout_s: float | None = None,
) -> Capture:
    """Run `command` under `nsys profile` into `report` (.nsys-rep), importing a left-over .qdstrm; output to `log`.

    With `log` and `echo`, the output also goes line by line to `echo`, less nsys's lines about the
    .qdstrm and the importer it could not find (this function imports the .qdstrm itself).
    """
    if report.suffix != ".nsys-rep":
        raise UserError(f"{report}: a report path must end in .nsys-rep")
    base = report.with_suffix("")
    qdstrm = base.with_suffix(".qdstrm")
    for stale in (report, qdstrm):
        stale.unlink(missing_ok=True)
    args = [str(nsys.executable), "profile", f"--trace={','.join(traces or machine_traces())}", *_QUIET_FLAGS,
            "--force-overwrite=true", f"--output={base}", *extra_args, *command]
    run_env = {**os.environ, **env} if env is not None else None
    with open(log, "w") if log else contextlib.nullcontext() as out:
        try:
            done = _run_nsys(args, run_env, out, echo, timeout_s)
        except subprocess.TimeoutExpired:
            raise UserError(f"nsys profile of {' '.join(command)!r} ran past {timeout_s} s")
    if not report.is_file() and qdstrm.is_file():
        _import_qdstrm(qdstrm, nsys)
    if not report.is_file():
        raise UserError(f"nsys profile of {' '.join(command)!r} made no report (exit {done.returncode}"
                        f"{f'; see {log}' if log else ''})")
    return Capture(report, done.returncode)


def _run_nsys(args: list[str], env: Mapping[str, str] | None, log: TextIO | None, echo: TextIO | None,
              timeout_s: float | None) -> subprocess.CompletedProcess:
    """Run `args` with stdout and stderr together, each line to `log` and, less nsys's importer noise, to
    `echo` (without `log`, the output goes where ours does).

    Interrupted, it passes a SIGTERM on to nsys, which stops the profiled command: Ctrl-C reaches nsys
    too, but a SIGTERM (see itertrace.cli) only us, and otherwise we would wait for the command to end."""
    killed = threading.Event()
    piped = log is not None
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE if piped else None,
                            stderr=subprocess.STDOUT if piped else None, text=True, errors="replace", bufsize=1)
    try:
        returncode = _follow(proc, log, echo, timeout_s, killed)
    finally:  # however it ended: nothing may remove the capture's folder while nsys's agent still writes in it
        wait_for_agent(proc.pid)
    if killed.is_set():
        raise subprocess.TimeoutExpired(args, timeout_s)
    return subprocess.CompletedProcess(args, returncode)


def wait_for_agent(nsys_pid: int, timeout_s: float = AGENT_TIMEOUT_S) -> None:
    """Return once the agent that `nsys profile` (process `nsys_pid`) started has ended, killing it after
    `timeout_s`.

    The agent (`nsys --start-agent --session-name=profile-...-PID`) leaves nsys's process tree (its
    parent is init) and writes the capture's .qdstrm, tens of MB, after the nsys command itself has
    ended, most of all when that command was stopped by a signal. It has ended once it runs no code of
    its own: its process is gone, or is a zombie whose status its parent has yet to collect. An exiting
    process already reads an empty command line, so each agent is found once and then followed by its
    PID and start time (a PID used again later names another process)."""
    agents = {pid: started for pid in _agents(nsys_pid) if (started := _start_time(pid)) is not None}
    deadline = time.monotonic() + timeout_s
    while (running := [pid for pid, started in agents.items() if _runs(pid, started)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state first), or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None  # field 22 of stat: clock ticks since boot


def _runs(pid: int, started: int) -> bool:
    """Whether process `pid`, started at `started`, still runs: not gone, not a zombie, not another process."""
    fields = _stat(pid)
    return fields is not None and int(fields[19]) == started and fields[0] not in ("Z", "X")


def _agents(nsys_pid: int) -> list[int]:
    """The running nsys agents of the session that `nsys profile` (process `nsys_pid`) started."""
    suffix = f"-{nsys_pid}".encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # it has just ended
            continue
        if b"--start-agent" in args and any(a.startswith(b"--session-name=") and a.endswith(suffix) for a in args):
            found.append(int(cmdline.parent.name))
    return found


def _follow(proc: subprocess.Popen, log: TextIO | None, echo: TextIO | None, timeout_s: float | None,
            killed: threading.Event) -> int:
    """Copy nsys's output as _run_nsys says until it exits; its exit status."""
    piped = log is not None
    with proc:

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill) if timeout_s else None
        if timer is not None:
            timer.start()
        held = None  # nsys's "Generated:" line, shown only if the path after it is no .qdstrm
        try:
            for line in proc.stdout if piped else ():
                log.write(line)
                if echo is None:
                    continue
                if held is not None and not _QDSTRM_PATH.match(line):
                    echo.write(held)
                held = line if _GENERATED.match(line) else None
                if held is None and not _IMPORTER_NOISE.match(line):
                    echo.write(line)
                    echo.flush()
            returncode = proc.wait()
        except BaseException:
            if proc.poll() is None:
                proc.terminate()
            raise
        finally:
            if timer is not None:
                timer.cancel()
    return returncode


def _import_qdstrm(qdstrm: Path, nsys: Nsys) -> None:
    importer = nsys.importer()
    if importer is None:
        raise UserError(f"{qdstrm}: nsys left a .qdstrm and no QdstrmImporter was found beside {nsys.executable}")
    done = subprocess.run([str(importer), "-i", str(qdstrm)], capture_output=True, text=True)
    if done.returncode != 0 or not qdstrm.with_suffix(".nsys-rep").is_file():
        said = (done.stderr + done.stdout).strip().splitlines()
        raise UserError(f"{qdstrm}: QdstrmImporter failed ({said[-1] if said else f'exit {done.returncode}'})")
    qdstrm.unlink()


def _locate(executable: str | Path | None) -> Path | None:
    if executable is not None:
        path = Path(executable)
        found = shutil.which(str(path)) if path.parent == Path(".") else (str(path) if os.access(path, os.X_OK) else None)
        return Path(found) if found else None
    on_path = shutil.which("nsys")
    if on_path:
        return Path(on_path)
    for pattern in _KNOWN_LOCATIONS:
        matches = sorted(Path("/").glob(pattern.lstrip("/")))
        if matches and os.access(matches[-1], os.X_OK):
            return matches[-1]
    return None

