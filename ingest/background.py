"""Work run on a second connection to the ingest's database, in a thread, while the first goes on.

The ingest runs as one transaction, which a second connection cannot see into: what the work reads
must be there before (the export's tables, read where they lie), and what it writes goes to `WORK`,
an in-memory database attached to both. The work commits there before the first connection reads
it, and the first connection's transaction, begun earlier, still sees it: DuckDB begins a
transaction in an attached database when the transaction first touches it, and the first connection
touches `WORK` only after the work is done. `WORK` lives within DuckDB's memory limit (spilling to
disk past it); the caller detaches it when done, and a failed ingest's connection takes it on closing.

The work's Python runs while the first connection's statements run in DuckDB, which lets go of the
interpreter; numpy lets go of it in its sorts and searches: on two cores the two overlap.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import duckdb

from itertrace.interrupts import deferred, quiet_progress

WORK = "_ingest_work"


class Cancelled(Exception):
    """Raised inside a job whose ingest failed or was interrupted, to end it early."""


class SideJob:
    """`work(side, cancel)` in a thread on the connection `open_side()` returns, from `start` on; `wait` for
    its end; `close` in a `finally` that begins before `start`.

    A signal can break into any line of Python, a `with` statement's entry included, so the thread
    starts inside the caller's `try` and `close` waits for it however far `start` got. Nothing joins
    the thread where a signal can break in: in Python 3.11 a signal's exception that interrupts `join`
    marks the thread as ended while it still runs, and a thread left at work inside DuckDB while the
    interpreter shuts down aborts the process. `wait` and `close` wait on an event the thread sets as its
    last step; the join after it runs in a `deferred()` block.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, open_side: Callable[[], duckdb.DuckDBPyConnection],
                 work: Callable[[duckdb.DuckDBPyConnection, threading.Event], None]) -> None:
        con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {WORK}")
        self._side = open_side()
        quiet_progress(self._side)
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._started = False
        self._error: BaseException | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, name="itertrace-side-job", daemon=True)

    def start(self) -> None:
        self._started = True  # before the thread exists: close must wait for it from here on
        self._thread.start()

    def _run(self) -> None:
        try:
            self._work(self._side, self._cancel)
        except BaseException as exc:  # re-raised by wait, on the ingest's thread
            self._error = exc
        finally:
            self._done.set()

    def wait(self) -> None:
        """Block until the work is done; raise what it raised."""
        self._done.wait()
        self._join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop the work if it still runs (between its steps, or inside a statement), and close its connection."""
        with deferred():
            if self._started and not self._done.is_set():
                self._cancel.set()
                self._side.interrupt()
                self._done.wait()
                self._join()
            self._side.close()

    def _join(self) -> None:
        with deferred():
            if self._thread.ident is not None:  # `start` may have been broken off before the thread began
                self._thread.join()


def check(cancel: threading.Event | None) -> None:
    """Raise `Cancelled` once `cancel` is set: called by a job between its steps."""
    if cancel is not None and cancel.is_set():
        raise Cancelled("the ingest stopped")
