"""DuckDB connections as the commands use them: interruptible inside a long statement, no progress bar.

Python runs a signal handler on the main thread between two bytecodes, and a thread inside a long DuckDB
task runs none until the task ends (a scan that finds few rows can run for minutes). While `interruptible`
holds, a thread woken by the signal itself (`signal.set_wakeup_fd`) interrupts the connection at once;
DuckDB's error then ends the statement, and the command's handler (itertrace.cli) reports the signal.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import duckdb

_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


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
            if not done.is_set() and _SIGNALS.intersection(received):
                con.interrupt()

    watcher = threading.Thread(target=watch, name="itertrace-interrupt", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(before)
        done.set()
        os.write(write_fd, b"\0")  # wakes the watcher to end
        watcher.join()
        os.close(read_fd)
        os.close(write_fd)


def quiet_progress(con: duckdb.DuckDBPyConnection) -> None:
    """No DuckDB progress bar on `con`: the commands print their own, on stderr, and stdout carries rows.
    (In Jupyter without ipywidgets DuckDB refuses to change the setting; the bar is off there anyway.)"""
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:
        pass
