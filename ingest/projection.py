"""NVTX ranges projected onto the GPU by walking each launch up its thread's push/pop nesting (numpy).

A launch (an API call that launched GPU work) lies inside a range when the range starts no later and
ends no earlier than the call, on the call's thread. On a thread whose push/pop ranges form a stack
(every range with a depth above 0 has its parent), the ranges open when a call starts are the range
opened last before it (`L`, found by a binary search among the thread's starts) and `L`'s ancestors:
so the ranges a call lies inside are found by walking up from `L` and keeping those that end no earlier
than the call, a few steps per call instead of a join over every (range, call) pair. One exception:
a call of zero length at the instant one range ends and the next starts lies inside both, and only
the second is on the walk; such calls, start/end ranges, and the threads without a stack are left to
the interval join in `nvtx_gpu_projection.sql`.

Notes
-----
Every step is a binary search or a gather over int64 arrays of one group of threads (at most
`CHUNK_RANGES` ranges; a larger thread in spans of time of about that many), whose per-range sums go
into DuckDB before the next.
The join this replaces (an IEJoin on thread and time packed into a HUGEINT) took 7.4 s of 37 on a
capture of 6.1M ranges, in one run.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from itertrace.ingest import nesting
from itertrace.ingest.scan import from_numpy

_SCHEMA = pa.schema([("range_id", pa.int64()), ("gpu_start_ns", pa.int64()), ("gpu_end_ns", pa.int64()),
                     ("gpu_ops", pa.int64()), ("launches", pa.int64())])


def create_walked_projection(con: duckdb.DuckDBPyConnection) -> None:
    """The temp tables `_nvtx_walk_threads` (threads whose push/pop ranges form a stack) and
    `_nvtx_projection_walked`: per push/pop range of those threads, the span, GPU operations and launches
    of its calls of non-zero length, read from `_nvtx_range_rows` (push/pop ranges: those with a depth) and `_gpu_launches`."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _nvtx_walk_threads AS
        SELECT global_tid, count(*) AS ranges FROM _nvtx_range_rows
        WHERE depth IS NOT NULL AND global_tid IN (SELECT global_tid FROM _gpu_launches)
        GROUP BY global_tid HAVING count(*) FILTER (depth > 0 AND parent_range_id IS NULL) = 0""")
    con.execute("CREATE OR REPLACE TEMP TABLE _nvtx_projection_walked (range_id BIGINT, gpu_start_ns BIGINT, "
                "gpu_end_ns BIGINT, gpu_ops BIGINT, launches BIGINT)")
    ts = con.execute("SELECT coalesce(max(greatest(start, coalesce(\"end\", start))), 0) FROM _raw_nvtx").fetchone()[0]
    counts = con.execute("SELECT global_tid, ranges FROM _nvtx_walk_threads ORDER BY global_tid").fetchall()
    for first, last, n in nesting.thread_groups(counts, nesting.CHUNK_RANGES):
        for lo, hi in _slices(con, first, n):
            ranges = con.execute(
                "SELECT global_tid, range_id, start_ns, coalesce(end_ns, $ts) AS end_eff, parent_range_id, "
                "end_global_tid IS NULL OR end_global_tid = global_tid AS projected FROM _nvtx_range_rows "
                "WHERE depth IS NOT NULL AND global_tid BETWEEN $first AND $last "
                "AND global_tid IN (SELECT global_tid FROM _nvtx_walk_threads) "
                "AND start_ns < $hi AND coalesce(end_ns, $ts) >= $lo",
                {"ts": ts, "first": first, "last": last, "lo": lo, "hi": hi}).fetchnumpy()
            calls = con.execute(
                "SELECT global_tid, start_ns, end_ns, gpu_start_ns, gpu_end_ns, gpu_ops FROM _gpu_launches "
                "WHERE end_ns > start_ns AND global_tid BETWEEN $first AND $last AND start_ns >= $lo "
                "AND start_ns < $hi AND global_tid IN (SELECT global_tid FROM _nvtx_walk_threads)",
                {"first": first, "last": last, "lo": lo, "hi": hi}).fetchnumpy()
            nesting.insert(con, "_nvtx_projection_walked", walk(ranges, calls))


def _slices(con: duckdb.DuckDBPyConnection, tid: int, ranges: int) -> list[tuple[int, int]]:
    """[lo, hi) spans of call start times that split a thread of more than `CHUNK_RANGES` ranges into
    pieces of about that many; one unbounded span otherwise.

    A piece's calls need only the ranges open during it (start < hi, end >= lo): every range a call lies
    inside is open when it starts, and so are the ancestors of every such range."""
    lowest, highest = -(2**63), 2**63 - 1
    if ranges <= nesting.CHUNK_RANGES:
        return [(lowest, highest)]
    cuts = nesting.cut_points(con, "start_ns", "_nvtx_range_rows WHERE depth IS NOT NULL AND global_tid = ?", [tid])
    bounds = [lowest, *cuts, highest]
    return list(zip(bounds[:-1], bounds[1:]))


def walk(ranges: dict[str, np.ndarray], calls: dict[str, np.ndarray]) -> pa.Table:
    """Per range, the launches in `calls` that lie inside it, summed (`_SCHEMA`).

    `ranges` holds whole threads' push/pop ranges in any order, each with its parent's range_id (NULL at
    top level), and `projected` False for a range that no launch may be counted in (it ended on another
    thread) but that is still walked through."""
    range_id = np.asarray(ranges["range_id"], dtype=np.int64)
    # By thread, then range_id; stored nearly in range_id order, which a stable sort takes quickly.
    order = np.argsort(range_id, kind="stable")
    order = order[np.argsort(np.asarray(ranges["global_tid"], dtype=np.int64)[order], kind="stable")]
    range_id = range_id[order]
    tid, start, end = (np.asarray(ranges[k], dtype=np.int64)[order] for k in ("global_tid", "start_ns", "end_eff"))
    parent = _positions(range_id, np.ma.asarray(ranges["parent_range_id"])[order])
    projected = np.asarray(ranges["projected"], dtype=bool)[order]
    del order
    c_tid, c_start, c_end = (np.asarray(calls[k], dtype=np.int64) for k in ("global_tid", "start_ns", "end_ns"))
    at = _last_opened(tid, start, c_tid, c_start)
    call = np.flatnonzero(at >= 0)
    at = at[call]
    hits_range, hits_call = [], []
    while len(at):
        inside = (end[at] >= c_end[call]) & projected[at]
        hits_range.append(at[inside])
        hits_call.append(call[inside])
        at = parent[at]
        up = at >= 0
        at, call = at[up], call[up]
    hit_range = np.concatenate(hits_range) if hits_range else np.empty(0, dtype=np.int64)
    hit_call = np.concatenate(hits_call) if hits_call else np.empty(0, dtype=np.int64)
    return _sums(range_id, hit_range, hit_call, calls)


def _positions(range_id: np.ndarray, parent: np.ma.MaskedArray) -> np.ndarray:
    """Each parent as a position in `range_id` (unique ids), -1 for none."""
    missing = np.ma.getmaskarray(parent)
    ids = np.asarray(parent.filled(0), dtype=np.int64)
    if not len(range_id):
        return np.full(len(ids), -1, dtype=np.int64)
    order = np.argsort(range_id, kind="stable")  # threads apart, each sorted: a stable sort merges them quickly
    found = order[np.minimum(np.searchsorted(range_id[order], ids), len(range_id) - 1)]
    return np.where(missing, -1, found)


def _last_opened(tid: np.ndarray, start: np.ndarray, c_tid: np.ndarray, c_start: np.ndarray) -> np.ndarray:
    """Per call, the position of the last range of its thread with start <= the call's start, else -1."""
    at = np.full(len(c_start), -1, dtype=np.int64)
    if not len(tid) or not len(c_tid):  # a span of time with no ranges open, or with no calls
        return at
    by_thread = np.argsort(c_tid, kind="stable")
    sorted_tid = c_tid[by_thread]
    bounds = np.flatnonzero(np.diff(tid)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(tid)]):  # one thread's ranges: start sorted
        mine = by_thread[np.searchsorted(sorted_tid, tid[lo]):np.searchsorted(sorted_tid, tid[lo], side="right")]
        found = lo + np.searchsorted(start[lo:hi], c_start[mine], side="right") - 1
        at[mine] = np.where(found >= lo, found, -1)
    return at


def _sums(range_id: np.ndarray, hit_range: np.ndarray, hit_call: np.ndarray,
          calls: dict[str, np.ndarray]) -> pa.Table:
    """min(gpu_start), max(gpu_end), sum(gpu_ops) and count per range hit."""
    order = np.argsort(hit_range, kind="stable")
    hit_range, hit_call = hit_range[order], hit_call[order]
    if not len(hit_range):
        return _SCHEMA.empty_table()
    firsts = np.r_[0, np.flatnonzero(np.diff(hit_range)) + 1]
    g_start = np.asarray(calls["gpu_start_ns"], dtype=np.int64)[hit_call]
    g_end = np.asarray(calls["gpu_end_ns"], dtype=np.int64)[hit_call]
    ops = np.asarray(calls["gpu_ops"], dtype=np.int64)[hit_call]
    columns = [range_id[hit_range[firsts]], np.minimum.reduceat(g_start, firsts), np.maximum.reduceat(g_end, firsts),
               np.add.reduceat(ops, firsts), np.diff(np.r_[firsts, len(hit_range)])]
    return pa.Table.from_arrays([from_numpy(c) for c in columns], schema=_SCHEMA)
