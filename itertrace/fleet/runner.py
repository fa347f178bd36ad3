"""Run one task per job on the Dask client and hand back each outcome as it completes, counting on stderr.

A task catches what goes wrong inside it and returns it in its outcome; what fails outside it (its worker
died three times, the task could not be sent) becomes a failed outcome too, so that one capture never
ends the fleet. Dask reschedules the task of a worker that died on another worker by itself. Without a
client, the tasks run one after another in this process (the benchmark's check).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TextIO, TypeVar


class Job(Protocol):
    name: str  # the capture's name


class Outcome(Protocol):
    error: str | None  # one line; None when the task did its work


J = TypeVar("J", bound=Job)
O = TypeVar("O", bound=Outcome)


def run_tasks(client, task: Callable[[J], O], jobs: Sequence[J], failed: Callable[[J, str], O]) -> Iterator[tuple[J, O]]:
    """(job, outcome) for every job, in the order they complete; `failed(job, line)` makes the outcome of a
    task that did not return one. Leaving the loop early cancels the tasks not yet run."""
    if client is None:
        for job in jobs:
            yield job, task(job)
        return
    from distributed import as_completed

    futures = client.map(task, list(jobs), pure=False)
    of = {future.key: job for future, job in zip(futures, jobs)}
    left = set(of)
    try:
        for future in as_completed(futures, loop=client.loop):
            job = of[future.key]
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - any failure outside the task is this capture's, not the fleet's
                outcome = failed(job, lost_task(exc))
            left.discard(future.key)
            future.release()
            yield job, outcome
    finally:
        if left:
            client.cancel([f for f in futures if f.key in left], force=True)


def lost_task(exc: BaseException) -> str:
    """One line for a task that returned no outcome."""
    if type(exc).__name__ == "KilledWorker":
        return ("its worker died each time it ran it (distributed.scheduler.allowed-failures times): out of memory, "
                "or killed")
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class TaskProgress:
    """`WHAT: D done, F failed, L left` on stderr: rewritten in place on a terminal, a line every few
    seconds in a log, and once more at the end."""

    def __init__(self, what: str, total: int, stream: TextIO | None = None, *, enabled: bool = True,
                 interval_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total = what, total
        self.done = self.failed = 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = enabled and self._stream.isatty()
        self._interval_s = interval_s if interval_s is not None else (0.2 if self._tty else 10.0)
        self._clock = clock
        self._shown_at: float | None = None
        self._width = 0

    @property
    def left(self) -> int:
        return self.total - self.done - self.failed

    def line(self) -> str:
        return f"{self.what}: {self.done:,} done, {self.failed:,} failed, {self.left:,} left"

    def count(self, *, failed: bool) -> None:
        """One more task ended, failed or not."""
        if failed:
            self.failed += 1
        else:
            self.done += 1
        now = self._clock()
        if self._shown_at is None or now - self._shown_at >= self._interval_s or not self.left:
            self._show(now)

    def start(self) -> None:
        self._show(self._clock())

    def close(self) -> None:
        """Leave the terminal line empty for the closing message."""
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
        self._width = 0

    def _show(self, now: float) -> None:
        if not self._enabled:
            return
        self._shown_at = now
        text = self.line()
        if self._tty:
            self._stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
