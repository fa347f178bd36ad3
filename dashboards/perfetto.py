"""`export_perfetto`: a database as a Chrome-trace JSON timeline that ui.perfetto.dev and chrome://tracing open.

Tracks: each host thread with its NVTX ranges and marks (an iteration's step range carries the run log's
members and token counts in `args`) and its CUDA API calls; each GPU stream with its kernels, copies
and sets, with a flow arrow from the call that launched each; the host gaps of each step thread with
their parts laid end to end (`gap_tracks`); and one track per request from the run log (queued,
prefill chunks, decode, preempted, finished: `request_tracks`). Times are the database's, written as
microseconds with their nanosecond digits, so that the file read back by `itertrace ingest` gives
the same ranges and GPU work to the nanosecond (categories `itertrace_*` are this export's own
tracks and are not read back).

A capture of many iterations is cut to a window of iterations (`DEFAULT_ITERATIONS` from the first
unless told otherwise); everything that overlaps the window's time span is kept.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from itertrace.dashboards.perfetto_tracks import EVENT_MACROS, gap_tracks, host_tracks, request_tracks
from itertrace.errors import UserError
from itertrace.queries.api import QueryDB
from itertrace.targets import TIMELINE_MARK, Kind, hidden_file, remove_leftovers, replaceable

DEFAULT_ITERATIONS = 1000
BATCH_ROWS = 50_000


@dataclass(frozen=True)
class Window:
    """The part of the database exported: iterations first..last of `total`, the time span they cover."""

    first: int | None
    last: int | None
    total: int
    start_ns: int | None  # None: no limit
    end_ns: int | None

    def describe(self) -> str:
        if self.first is None:
            return "the whole capture (no iterations to cut it by)"
        if self.start_ns is None:
            return f"all {self.total:,} iterations ({self.first:,}-{self.last:,})"
        return f"iterations {self.first:,}-{self.last:,} of {self.total:,}"


@dataclass(frozen=True)
class Exported:
    """What export_perfetto wrote."""

    path: Path
    events: int
    window: Window


def export_perfetto(db: str | Path, out: str | Path, *, first: int | None = None, last: int | None = None,
                    params: dict[str, str] | None = None, memory_limit: str | None = None) -> Exported:
    """Write `db`'s timeline to `out` (.json, or gzipped .json.gz), iterations `first`..`last`.

    `out` may be absent or a timeline this export wrote; anything else there (a Kineto trace, the
    database, a settings file) is refused before any work."""
    out = Path(out)
    if not out.name.endswith((".json", ".json.gz")):
        raise UserError(f"-o {out}: name the file .json or .json.gz")
    if out.exists() and out.resolve() == Path(db).resolve():
        raise UserError(f"-o {out}: is the --db database; write the timeline to another file")
    out = replaceable(out, Kind.TIMELINE, "-o")
    remove_leftovers(out)
    with QueryDB(db, params, memory_limit=memory_limit) as qdb:
        if "nvtx_ranges" not in qdb.missing:
            qdb.sql("SELECT * FROM mapping")  # an incomplete mapping fails here, in one line
        window = _window(qdb, first, last)
        for macro in EVENT_MACROS:
            qdb.con.execute(macro)
        partial = hidden_file(out, "tmp")
        try:
            with (gzip.open(partial, "wb", compresslevel=6) if out.name.endswith(".gz") else open(partial, "wb")) as sink:
                events = _write(qdb, window, sink, _top_level(qdb, window))
            os.replace(partial, out)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    return Exported(out, events, window)


def _window(qdb: QueryDB, first: int | None, last: int | None) -> Window:
    """Iterations `first`..`last` (default: DEFAULT_ITERATIONS from the first) and the time span they cover."""
    if first is not None and last is not None and last < first:
        raise UserError(f"--to-iteration {last} is before --from-iteration {first}")
    if "nvtx_ranges" not in qdb.missing:
        table, start, end = "iterations", "host_start_ns", "greatest(host_end_ns, device_end_ns)"
    elif "run_iterations" not in qdb.missing:
        table, start, end = "run_iterations", "start_ns", "end_ns"
    else:
        raise UserError(f"{qdb.path}: no trace and no run log in this database; nothing to export")
    low, high, total = qdb.con.execute(f"SELECT min(iteration), max(iteration), count(DISTINCT iteration) FROM {table}"
                                       ).fetchall()[0]
    if not total:
        if first is not None or last is not None:
            raise UserError(f"{qdb.path}: the mapping finds no iterations here, so --from-iteration and "
                            "--to-iteration have nothing to cut by (see `itertrace query iterations --describe`)")
        return Window(None, None, 0, None, None)
    asked = f"{first if first is not None else low}..{last if last is not None else 'end'}"
    first = low if first is None else first
    last = first + DEFAULT_ITERATIONS - 1 if last is None else last
    start_ns, end_ns, inside, first_in, last_in = qdb.con.execute(
        f"SELECT min({start}), max({end}), count(DISTINCT iteration), min(iteration), max(iteration) FROM {table} "
        "WHERE iteration BETWEEN ? AND ?", [first, last]).fetchall()[0]
    if not inside:
        raise UserError(f"no iteration in {asked}: this database has iterations {low:,} to {high:,}")
    if first <= low and last >= high:  # every iteration: what lies before the first and after the last too
        start_ns = end_ns = None
    return Window(first_in, last_in, total, start_ns, end_ns)


def _top_level(qdb: QueryDB, window: Window) -> dict:
    """The keys beside traceEvents: the unit, the clock's base, and what was exported."""
    base = None
    if "capture_meta" not in qdb.missing:
        base = qdb.con.execute("SELECT min(session_start_utc_ns) FROM capture_meta").fetchall()[0][0]
    elif "run_meta" not in qdb.missing:
        base = qdb.con.execute("SELECT min(clock_epoch_unix_ns) FROM run_meta").fetchall()[0][0]
    top: dict = {"otherData": {TIMELINE_MARK: {"database": str(qdb.path.resolve()), "window": window.describe(),
                                               "first_iteration": window.first, "last_iteration": window.last}},
                 "displayTimeUnit": "ns"}
    if base is not None:
        top["baseTimeNanoseconds"] = base
    return top


def _write(qdb: QueryDB, window: Window, sink: BinaryIO, top: dict) -> int:
    """Every track's events into `sink` as one JSON object, the keys of `top` first (so that the file's
    head says who wrote it: itertrace.targets.Kind.TIMELINE); the number of events written."""
    sink.write(json.dumps(top)[:-1].encode() + b', "traceEvents": [\n')
    written = 0
    bounds = {"start": window.start_ns, "end": window.end_ns}
    for sql in (*host_tracks(qdb.missing), *gap_tracks(qdb.missing), *request_tracks(qdb.missing)):
        params = {name: value for name, value in bounds.items() if f"${name}" in sql}
        reader = qdb.con.sql(sql, params=params).to_arrow_reader(BATCH_ROWS)
        for batch in reader:
            lines = [line for line in batch.column(0).to_pylist() if line is not None]
            if lines:
                sink.write(((",\n" if written else "") + ",\n".join(lines)).encode())
                written += len(lines)
    sink.write(b"\n]}\n")
    return written
