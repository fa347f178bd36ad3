"""NVTX ranges' ids and push/pop nesting (depth and parent), computed with numpy from `_raw_nvtx`.

A range's depth is the number of ranges open on its thread when it opens: the ranges opened before it
there (those of smaller range_id, which orders a thread's ranges as a stack opens them) less those
closed before it, found by binary search among the thread's sorted close keys. Its parent is the range
opened last before it on its thread one level up, kept if it encloses it. The keys are those of the
SQL this replaces: at one instant closes of ranges that have a length come first (touching ranges are
siblings), then opens, then closes of zero-length ranges (2 * time + 0, 1 or 2).

Notes
-----
DuckDB did this as a window over both boundaries of every range and an ASOF join: on 6.1M ranges it
sorted 12M rows past the ingest's 512MB memory limit and spilled (17.8 s of CPU against 5.3 s here, one
run of each on the same ranges, identical results). Every step here is a sort or a binary search over
int64 arrays, reused in place where it can be: on those ranges (two threads of ~3M) numpy held at most
267 MB (tracemalloc, one run), beside what DuckDB holds within its limit. The range ids were a DuckDB
window over every range; numbered here by a sort per piece of them, they come out the same, and the
numbering and nesting together took 3.4-3.5 s (2 in-process runs) against about 5 s before (the window
2.3-2.7 s, the nesting 2.5-3.2 s, over several in-process runs).
"""
from __future__ import annotations

import threading

import duckdb
import numpy as np
import pyarrow as pa

from itertrace.ingest.background import check
from itertrace.interrupts import deferred
from itertrace.ingest.checks import PUSH_POP_TYPES, RANGE_TYPES
from itertrace.ingest.scan import from_numpy

_POSITION_BITS = 40  # a range's position among all ranges: up to 2**40 ranges
CHUNK_RANGES = 1_000_000  # ranges numbered and nested at once
RANGE_EVENTS = f"eventType IN {RANGE_TYPES}"
_SCHEMA = pa.schema([("_row", pa.int64()), ("range_id", pa.int64()), ("depth", pa.int32()),
                     ("parent_range_id", pa.int64())])


def create_range_nesting(con: duckdb.DuckDBPyConnection, table: str, cancel: threading.Event | None = None) -> None:
    """The table `table`: (_row, range_id, depth, parent_range_id) of every NVTX range in `_raw_nvtx`
    (depth and parent NULL for start/end ranges); stops between pieces once `cancel` is set.

    range_id is each range's position by (start, global_tid, effective end descending, raw row), from 1;
    the ranges are taken in pieces of about `CHUNK_RANGES` by start (quantiles, `cut_points`), so that a
    piece's ids follow the last piece's, sorted here. The nesting of a piece's push/pop ranges is computed
    with the ranges of earlier pieces still open on their threads (`_carried`), and each piece's rows go
    into DuckDB, within its memory limit, before the next: that bounds the memory the arrays take. A
    push/pop range without a start or a thread (no export seen has one) is numbered but not nested."""
    con.execute(f"CREATE OR REPLACE TABLE {table} (_row BIGINT, range_id BIGINT, depth INTEGER, parent_range_id BIGINT)")
    ts = con.execute('SELECT coalesce(max(greatest(start, coalesce("end", start))), 0) FROM _raw_nvtx').fetchall()[0][0]
    cuts = cut_points(con, "start", f"_raw_nvtx WHERE {RANGE_EVENTS}", [])
    spans = [f"start < {cuts[0]}"] if cuts else ["true"]
    spans += [f"start >= {lo} AND start < {hi}" for lo, hi in zip(cuts, cuts[1:])]
    spans += [f"start >= {cuts[-1]} OR start IS NULL"] if cuts else []  # NULL sorts last, as in SQL
    next_id, carried = 1, None
    for span in spans:
        check(cancel)
        piece = con.sql(
            "SELECT _row, coalesce(globalTid, 0) AS global_tid, coalesce(start, 0) AS start_ns, "
            "coalesce(greatest(coalesce(\"end\", $ts), start), 0) AS end_eff, (start IS NULL)::BIGINT AS start_null, "
            f"(globalTid IS NULL)::BIGINT AS tid_null, (eventType IN {PUSH_POP_TYPES} AND start IS NOT NULL AND globalTid IS NOT NULL)::BIGINT "
            f"AS nested FROM _raw_nvtx WHERE ({RANGE_EVENTS}) AND ({span})", params={"ts": ts}).to_arrow_table()
        carried = _number_and_nest(con, table, piece, next_id, carried)
        next_id += piece.num_rows


def _number_and_nest(con: duckdb.DuckDBPyConnection, table: str, piece: pa.Table, first_id: int,
                     carried: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Number one piece's ranges from `first_id`, nest its push/pop ranges after the `carried` ones of
    earlier pieces, and insert its rows; returns the push/pop ranges to carry into the next piece."""
    row, tid, start, end = (_ints(piece, name) for name in ("_row", "global_tid", "start_ns", "end_eff"))
    order = _range_order(row, tid, start, end, _bools(piece, "tid_null"), _bools(piece, "start_null"))
    range_id = np.empty(len(order), dtype=np.int64)
    range_id[order] = np.arange(first_id, first_id + len(order), dtype=np.int64)
    del order, row
    nested = _bools(piece, "nested")
    ranges = {"range_id": range_id[nested], "tid": tid[nested], "start": start[nested], "end": end[nested]}
    del tid, start, end
    if carried is not None:
        ranges = {key: np.concatenate([carried[key], values]) for key, values in ranges.items()}
    if not len(ranges["range_id"]):
        depth_of, parent_of = np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int64)
    else:
        depth_of, parent_of = _nest(ranges)
    mine = len(ranges["range_id"]) - int(nested.sum())  # the carried ranges come first
    depth = np.zeros(piece.num_rows, dtype=np.int32)
    depth[nested] = depth_of[mine:]
    parent = np.full(piece.num_rows, -1, dtype=np.int64)
    parent[nested] = parent_of[mine:]
    insert(con, table, pa.Table.from_arrays([piece.column("_row"), from_numpy(range_id), from_numpy(depth, ~nested),
                                       from_numpy(parent, parent < 0)], schema=_SCHEMA))
    return _carried(ranges)


def _range_order(row: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray, tid_null: np.ndarray,
                 start_null: np.ndarray) -> np.ndarray:
    """The ranges' order by (start, global_tid, end descending, raw row), NULLs last as in SQL.

    nsys writes ranges sorted by start, and few share a start: a stable sort by start alone (timsort,
    one pass over sorted keys) and a sort by all the keys of the ranges that tie on it cost a fraction of
    a sort by all the keys."""
    if start_null.any() or tid_null.any():
        return np.lexsort((row, -end, tid, tid_null, start, start_null))
    order = np.argsort(start, kind="stable")
    ties = start[order[1:]] == start[order[:-1]]
    if not ties.any():
        return order
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= ties
    tied[:-1] |= ties
    at = np.flatnonzero(tied)
    group = np.cumsum(np.r_[True, ~ties])[at]  # equal starts share a group, in start order
    which = order[at]
    order[at] = which[np.lexsort((row[which], -end[which], tid[which], group))]
    return order


def _carried(ranges: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ranges still open after the last open on their thread.

    A range that closed before its thread's last open so far plays no part in the nesting of that
    thread's later ranges: it adds one to each one's position and one to the closes before it, which
    cancel, and a parent is always still open. So only the others are carried into the next piece (about
    as many per thread as its depth there), computed again with it, and dropped."""
    threads = _threads(ranges["tid"])
    thread = np.searchsorted(threads, ranges["tid"])
    last = np.full(len(threads), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, thread, ranges["start"])
    start, end = ranges["start"], ranges["end"]
    keep = 2 * end + 2 * (end == start) > 2 * last[thread] + 1  # the keys of _depths
    return {key: values[keep] for key, values in ranges.items()}


def thread_groups(counts: list[tuple[int, int]], budget: int) -> list[tuple[int, int, int]]:
    """(first, last, ranges): consecutive threads whose ranges add up to at most `budget`, or one thread."""
    groups: list[tuple[int, int, int]] = []
    for tid, n in counts:
        if groups and groups[-1][2] + n <= budget:
            groups[-1] = (groups[-1][0], tid, groups[-1][2] + n)
        else:
            groups.append((tid, tid, n))
    return groups


def cut_points(con: duckdb.DuckDBPyConnection, column: str, rows: str, params: list) -> list:
    """Values of `column` that split `rows` (SQL after FROM) into pieces of at most about `CHUNK_RANGES`
    rows each (none where they fit in one): quantiles, which DuckDB finds without a sort."""
    n = con.execute(f"SELECT count(*) FROM {rows}", params).fetchall()[0][0]
    pieces = -(-n // CHUNK_RANGES)
    fractions = ", ".join(str(i / pieces) for i in range(pieces))
    cuts = con.execute(f"SELECT quantile_disc({column}, [{fractions}]) FROM {rows}", params).fetchall()[0][0]
    return sorted(set(cuts or []))[1:]  # the first is the least value


def insert(con: duckdb.DuckDBPyConnection, table: str, part: pa.Table) -> None:
    """Insert `part` into `table` through a relation."""
    # Read through a relation, not a registered view: an open transaction (the ingest's, where the
    # projection inserts) keeps an unregistered view, and with it the Arrow table, until it commits.
    with deferred():  # DuckDB's scan of the table runs pyarrow's Python: a signal must not raise in it
        con.from_arrow(part).insert_into(table)


def _bools(table: pa.Table, name: str) -> np.ndarray:
    """A column of 0s and 1s without NULLs as numpy booleans."""
    return _ints(table, name).astype(bool)


def _ints(table: pa.Table, name: str) -> np.ndarray:
    """A column of int64 without NULLs as numpy, from its buffers (pyarrow's to_numpy imports pandas)."""
    chunks = [np.frombuffer(c.buffers()[1], dtype=np.int64, count=len(c), offset=c.offset * 8)
              for c in table.column(name).cast(pa.int64()).chunks]
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)


def _nest(ranges: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(depth, parent range_id or -1) of push/pop `ranges` (range_id, tid, start, end: whole threads, or
    their ranges from the last still open on), in their order."""
    threads = _threads(ranges["tid"])
    order, thread = _stack_order(ranges["range_id"], ranges["tid"], threads)
    end = ranges["end"][order]
    depth = _depths(thread, ranges["start"][order], end)
    parent_at = _parents(thread, depth, end)
    del thread, end
    range_id = ranges["range_id"][order]
    parent = np.where(parent_at >= 0, range_id[np.maximum(parent_at, 0)], -1)
    del parent_at, range_id
    depth_of, parent_of = np.empty(len(order), dtype=np.int32), np.empty(len(order), dtype=np.int64)
    depth_of[order] = depth
    parent_of[order] = parent
    return depth_of, parent_of


def _threads(tid: np.ndarray) -> np.ndarray:
    """The distinct threads, sorted (pyarrow's hashed unique costs 0.3 s on its first call)."""
    return np.unique(tid)


def _stack_order(range_id: np.ndarray, global_tid: np.ndarray,
                 threads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ranges' order by thread, then range_id; and each one's thread as an index 0, 1, ... into
    `threads` (their distinct global_tids, sorted), in that order."""
    order = np.argsort(range_id, kind="stable")  # stored nearly in range_id order, which timsort takes in one pass
    thread = np.searchsorted(threads, global_tid[order])
    if len(threads) <= np.iinfo(np.uint16).max:
        thread = thread.astype(np.uint16)  # numpy sorts 16-bit keys by radix, in linear time
    by_thread = np.argsort(thread, kind="stable")
    return order[by_thread], thread[by_thread].astype(np.int64)


def _depths(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each range's depth: its position on its thread less the closes on its thread before it opens.

    Positions and closes both count the ranges of earlier threads, which cancel out: each of those has
    opened and closed before. Keys of different threads are kept apart by offsetting each thread's.
    Arrays are reused in place: on millions of ranges each is tens of MB."""
    closes = 2 * end
    closes[end == start] += 2
    opens = 2 * start
    opens += 1
    low = min(opens.min(), closes.min())
    span = int(max(opens.max(), closes.max())) - int(low) + 1
    if span * (int(thread[-1]) + 1) < 2**62:
        offset = thread * span
        offset -= low
        closes += offset
        opens += offset
        del offset
        closes.sort(kind="stable")  # runs of a thread's closes, nearly in order: timsort merges them
        closed = np.searchsorted(closes, opens)
    else:  # keys too far apart to offset: one thread at a time
        closed = np.empty(len(opens), dtype=np.int64)
        bounds = np.flatnonzero(np.diff(thread)) + 1
        for first, last in zip(np.r_[0, bounds], np.r_[bounds, len(thread)]):
            closed[first:last] = first + np.searchsorted(np.sort(closes[first:last]), opens[first:last])
    del opens, closes
    return np.subtract(np.arange(len(closed), dtype=np.int64), closed, out=closed)


def _parents(thread: np.ndarray, depth: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each range's parent as a position in the stack order, -1 for none.

    The candidate is the last range before it, in the stack order, one level up: a binary search among
    the ranges sorted by depth, then position. It is its parent if it is on the same thread (anything
    between them in the stack order is, too) and ends no earlier. The ranges are looked up in that same
    order (each key one level down is sorted too), which keeps the search in cache."""
    small = depth.max() <= np.iinfo(np.int16).max
    by_depth = np.argsort(depth.astype(np.int16) if small else depth, kind="stable")
    keys = by_depth + (depth[by_depth] << _POSITION_BITS)
    found = np.empty(len(depth), dtype=np.int64)
    found[by_depth] = np.searchsorted(keys, keys - (1 << _POSITION_BITS))
    del by_depth
    found -= 1
    ok = (found >= 0) & (depth >= 1)
    at = keys[np.maximum(found, 0, out=found)]
    del keys, found
    ok &= (at >> _POSITION_BITS) == depth - 1
    at &= (1 << _POSITION_BITS) - 1
    ok &= (thread[at] == thread) & (end[at] >= end)
    at[~ok] = -1
    return at
