"""A real Dask cluster on localhost for the fleet tests: `dask scheduler` and `dask worker` processes.

The scheduler picks a free port itself (--port 0) and writes its address into a scheduler file; the test
waits for that file, then for the workers to register, each by polling its condition against a generous
deadline (no fixed sleep). Every process is started in a session of its own and stopped, with all it
started, when the block ends, however it ends.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DASK = Path(sys.executable).with_name("dask")
DEADLINE_S = 180.0


def wait_until(condition: Callable[[], object], what: str, *, deadline_s: float = DEADLINE_S,
               alive: subprocess.Popen | None = None) -> object:
    """Poll `condition` until it returns something true; AssertionError after `deadline_s`, or at once if `alive`
    (a process the condition depends on) has ended."""
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"{what}: the process ended first (status {alive.returncode})")
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(0.05)


def stop(process: subprocess.Popen) -> None:
    """End a process started in its own session, and everything in that session: SIGTERM, then SIGKILL."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # what the process started and left behind
    except ProcessLookupError:
        pass
    process.wait()


@contextmanager
def dask_cluster(folder: Path, workers: int = 2, preload: Path | None = None) -> Iterator[str]:
    """A scheduler and `workers` single-thread worker processes on localhost; yields the scheduler's address."""
    folder.mkdir(parents=True, exist_ok=True)
    scheduler_file = folder / "scheduler.json"
    started: list[subprocess.Popen] = []
    try:
        scheduler = _start([str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                            "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
                           folder / "scheduler.log")
        started.append(scheduler)
        address = wait_until(lambda: _address(scheduler_file), "the scheduler's address", alive=scheduler)
        for i in range(workers):
            command = [str(DASK), "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                       "--name", f"worker-{i}", "--local-directory", str(folder / f"worker-{i}")]
            if preload is not None:
                command += ["--preload", str(preload)]
            started.append(_start(command, folder / f"worker-{i}.log"))
        from distributed import Client

        with Client(address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=DEADLINE_S)  # polls the scheduler until they registered
        yield address
    finally:
        for process in reversed(started):
            stop(process)


def _start(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _address(scheduler_file: Path) -> str | None:
    try:
        return json.loads(scheduler_file.read_text())["address"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None

