"""The Dask client the fleet commands run their tasks on: a LocalCluster of its own, or an existing cluster.

A LocalCluster has one worker process per core (or --workers N), one thread each, so that each task owns a
core and DuckDB inside it gets the threads that fit (`ClusterOptions.task_threads`). An existing cluster is
reached at its scheduler's address; an address nobody answers at is refused at once, by a plain TCP
connect with a short timeout, before Dask's own connection (which retries until its timeout). Its
workers must see the captures and the fleet's folder at the same paths as this machine (a shared file
system): that is checked on every worker before any task runs.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from itertrace.errors import UserError

CONNECT_TIMEOUT_S = 5.0  # a TCP connect to the scheduler; Dask's own handshake then gets DASK_TIMEOUT_S
DASK_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class ClusterOptions:
    """Where the tasks run: an existing scheduler's address, else a LocalCluster of `workers` processes."""

    scheduler: str | None = None  # e.g. tcp://10.0.0.5:8786
    workers: int | None = None  # LocalCluster worker processes; None: one per core
    threads: int | None = None  # DuckDB threads per task; None: the cores a local worker owns, 1 on a cluster

    def local_workers(self) -> int:
        return self.workers or os.cpu_count() or 1

    def task_threads(self) -> int:
        """DuckDB threads for each task: given, else the cores per local worker, else 1 (a cluster's workers
        usually take a core each)."""
        if self.threads:
            return self.threads
        if self.scheduler:
            return 1
        return max(1, (os.cpu_count() or 1) // self.local_workers())


def scheduler_address(text: str) -> tuple[str, str, int]:
    """(address for Dask, host, port) of `--scheduler`: tcp://HOST:PORT, tls://HOST:PORT or HOST:PORT."""
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or port is None:
        raise UserError(f"--scheduler {text}: not a scheduler address; expected tcp://HOST:PORT (as `dask scheduler` "
                        "prints it)")
    return f"{parts.scheme}://{parts.netloc}", parts.hostname, port


def check_answers(text: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """The Dask address of `--scheduler`, after a TCP connect to it; one line where nobody answers there."""
    address, host, port = scheduler_address(text)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except socket.timeout:
        raise UserError(f"--scheduler {text}: no answer within {timeout_s:g} s; is `dask scheduler` running there, "
                        "and reachable from this machine?") from None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise UserError(f"--scheduler {text}: nobody answers there ({why}); start one with `dask scheduler`, or "
                        "leave --scheduler out to run on a local cluster") from None
    return address


@contextmanager
def fleet_client(options: ClusterOptions, fleet_root: Path | None = None,
                 inputs: tuple[Path, ...] = ()) -> Iterator[object]:
    """A `distributed.Client` for the fleet's tasks, closed (with its LocalCluster) when the block ends.

    On an existing cluster, every worker must see the fleet's folder and each of `inputs` (check_shared)."""
    address = check_answers(options.scheduler) if options.scheduler else None
    from distributed import Client, LocalCluster  # imported only by the commands that run tasks

    cluster = None
    client = None
    try:
        if address:
            try:
                client = Client(address, timeout=DASK_TIMEOUT_S, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                raise UserError(f"--scheduler {options.scheduler}: the scheduler did not take the connection "
                                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
            if not client.scheduler_info().get("workers"):
                client.wait_for_workers(1, timeout=DASK_TIMEOUT_S)
            if fleet_root is not None:
                check_shared(client, fleet_root, inputs)
        else:
            with _interrupts_not_inherited():
                cluster = LocalCluster(n_workers=options.local_workers(), threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=logging.ERROR,
                                       # no dashboard; the scheduler's HTTP routes on a free port, not on 8787
                                       scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
            client = Client(cluster, set_as_default=False)
        yield client
    finally:
        if client is not None:
            client.close(timeout=CLOSE_TIMEOUT_S)
        if cluster is not None:
            cluster.close(timeout=CLOSE_TIMEOUT_S)


@contextmanager
def _interrupts_not_inherited() -> Iterator[None]:
    """SIGINT ignored while the local cluster starts its processes, which keep it ignored (an ignored signal stays
    ignored across exec, and Python then installs no handler): Ctrl-C on a terminal reaches every process of its
    group, and the workers are this command's to stop, as it does when the signal reaches it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def check_shared(client, fleet_root: Path, inputs: tuple[Path, ...]) -> None:
    """A UserError naming the first worker that cannot see a file written here into the fleet's folder, or
    one of `inputs` (the captures): the workers must share this machine's paths."""
    fd, name = tempfile.mkstemp(prefix=".itertrace-probe.", dir=fleet_root)
    os.close(fd)
    probe = Path(name)
    try:
        seen = client.run(_missing, [str(probe), *(str(p) for p in inputs)])
    finally:
        probe.unlink(missing_ok=True)
    for worker, missing in sorted(seen.items()):
        if missing:
            what = f"the fleet's folder {fleet_root}" if missing == str(probe) else missing
            raise UserError(f"worker {worker} does not see {what}: the workers of --scheduler must see the "
                            "captures and the fleet at the same paths as this machine (a shared file system)")


def _missing(paths: list[str]) -> str | None:
    """On a worker: the first of `paths` it cannot see, else None."""
    return next((p for p in paths if not os.path.exists(p)), None)
