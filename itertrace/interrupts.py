"""Ctrl-C and SIGTERM for the commands: where a signal may raise, and DuckDB connections that hear it.

Python runs a signal handler on the main thread between two bytecodes and, as the commands install
it (`Signals`), raises KeyboardInterrupt (or `Terminated`) there: in the commands' own Python that is
what stops them. Two places must not be broken into that way:
- a DuckDB statement that calls back into Python (an Arrow stream fed by a Python generator, pyarrow's
  dataset code scanning a registered table): an exception raised inside the callback would cross
  DuckDB's C++ scan;
- clean-up: a `finally` that joins a thread or closes a connection. Broken off half-way, it leaves a
  thread at work inside DuckDB while the interpreter shuts down, and the process aborts
  ("FATAL: exception not rethrown") instead of exiting with the signal's status.
Inside `deferred()` the handler only records the signal; the block raises it once it ends (unless it
ends with an error of its own, which the command then reports as the signal). A statement that runs
long still stops at once: while `interruptible(con)` holds, a thread woken by the signal itself
(`signal.set_wakeup_fd`) interrupts the connection, and DuckDB's error ends the statement.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the commands import this module to handle signals before any of them needs DuckDB
    import duckdb

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a `kill`, a job scheduler's time limit), raised where the program is, as Ctrl-C is: the
    commands clean up as they do on Ctrl-C (no half-written run directory is left)."""


def exception_for(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


class Signals:
    """The handler of SIGINT and SIGTERM the commands install, and the signal received, if any.

    A signal raises where the program is, unless inside `deferred()`; what it breaks may surface as
    another error (DuckDB's "Query interrupted", a failed scan): the command reports whatever ends it
    after a signal as that signal."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.pending: int | None = None  # received inside `deferred()`, not raised yet
        self.depth = 0  # how many `deferred()` blocks the main thread is in

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self.depth:
            self.pending = signum
            return
        raise exception_for(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        """Handle SIGINT and SIGTERM within the block (on the main thread; elsewhere as they were)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        before = {signum: signal.signal(signum, self.handle) for signum in HANDLED}
        try:
            yield self
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)


class deferred:
    """A block that no signal breaks into: a signal received inside is raised when the block ends.

    Only where `Signals` is installed and only on the main thread (where Python handles signals);
    elsewhere the block runs as it is. Blocks nest; the outermost raises."""

    def __enter__(self) -> deferred:
        self._signals = _installed() if threading.current_thread() is threading.main_thread() else None
        if self._signals is not None:
            self._signals.depth += 1
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        signals = self._signals
        if signals is None:
            return
        signals.depth -= 1
        if signals.depth == 0 and signals.pending is not None:
            signum, signals.pending = signals.pending, None
            if kind is None:  # an error of the block's own goes on; the command reports the signal
                raise exception_for(signum)


def _installed() -> Signals | None:
    handler = signal.getsignal(signal.SIGINT)
    owner = getattr(handler, "__self__", None)
    return owner if isinstance(owner, Signals) else None


@contextlib.contextmanager
def interruptible(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Within the block, a SIGINT or SIGTERM interrupts what `con` is running (on the main thread only,
    where Python handles signals; elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    before = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            received = os.read(read_fd, 64)
            if not done.is_set() and set(HANDLED).intersection(received):
                con.interrupt()

    watcher = threading.Thread(target=watch, name="itertrace-interrupt", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with deferred():  # the watcher ends before the block does, whatever arrives meanwhile
            signal.set_wakeup_fd(before)
            done.set()
            os.write(write_fd, b"\0")  # wakes the watcher to end
            watcher.join()
            os.close(read_fd)
            os.close(write_fd)


def quiet_progress(con: duckdb.DuckDBPyConnection) -> None:
    """No DuckDB progress bar on `con`: the commands print their own, on stderr, and stdout carries rows.
    (In Jupyter without ipywidgets DuckDB refuses to change the setting; the bar is off there anyway.)"""
    import duckdb

    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:
        pass
