"""The push/pop nesting of NVTX ranges (depth and parent), computed with numpy from `_nvtx_range_numbered`.

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
267 MB (tracemalloc, one run), beside what DuckDB holds within its limit.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from itertrace.ingest.scan import from_numpy

_POSITION_BITS = 40  # a range's position among all ranges: up to 2**40 ranges
CHUNK_RANGES = 1_000_000  # ranges whose nesting is computed at once
_SCHEMA = pa.schema([("_row", pa.int64()), ("range_id", pa.int64()), ("depth", pa.int32()),
                     ("parent_range_id", pa.int64())])


def create_push_pop_nesting(con: duckdb.DuckDBPyConnection) -> None:
    """The temp table `_nvtx_push_pop_nesting`: (_row, range_id, depth, parent_range_id) of every push/pop
    range in `_nvtx_range_numbered`.

    Threads are independent: they are taken in groups of at most `CHUNK_RANGES` ranges, and a thread with
    more in pieces of `CHUNK_RANGES` (`_nest_in_pieces`); each group's or piece's rows go into DuckDB,
    within its memory limit, before the next: that bounds the memory the arrays take beside DuckDB's own."""
    con.execute("CREATE OR REPLACE TEMP TABLE _nvtx_push_pop_nesting "
                "(_row BIGINT, range_id BIGINT, depth INTEGER, parent_range_id BIGINT)")
    counts = con.execute("SELECT global_tid, count(*) FROM _nvtx_range_numbered WHERE is_push_pop "
                         "GROUP BY ALL ORDER BY global_tid").fetchall()
    for first, last, n in thread_groups(counts, CHUNK_RANGES):
        if n > CHUNK_RANGES:
            _nest_in_pieces(con, first)
        else:
            _insert(con, _nest(_fetch(con, "global_tid BETWEEN ? AND ?", [first, last])))


def thread_groups(counts: list[tuple[int, int]], budget: int) -> list[tuple[int, int, int]]:
    """(first, last, ranges): consecutive threads whose ranges add up to at most `budget`, or one thread."""
    groups: list[tuple[int, int, int]] = []
    for tid, n in counts:
        if groups and groups[-1][2] + n <= budget:
            groups[-1] = (groups[-1][0], tid, groups[-1][2] + n)
        else:
            groups.append((tid, tid, n))
    return groups


def _nest_in_pieces(con: duckdb.DuckDBPyConnection, tid: int) -> None:
    """One thread's nesting, `CHUNK_RANGES` ranges at a time in its stack order (range_id).

    A range of an earlier piece that closed before the last open of the piece before plays no part in
    the nesting of this one: it adds one to each range's position and one to the closes before it, which
    cancel, and a parent is always still open. So only the ranges still open after a piece's last open
    are carried into the next (about as many as its depth there), computed again with it, and dropped."""
    cuts = cut_points(con, "range_id", "_nvtx_range_numbered WHERE is_push_pop AND global_tid = ?", [tid])
    carried = None
    for lo, hi in zip(cuts, [*cuts[1:], None]):
        piece = _fetch(con, "global_tid = ? AND range_id >= ?" + ("" if hi is None else " AND range_id < ?"),
                       [tid, lo] + ([] if hi is None else [hi]))
        ranges = piece if carried is None else pa.concat_tables([carried, piece])
        _insert(con, _nest(ranges).slice(ranges.num_rows - piece.num_rows))  # carried ranges come first
        start, end = _ints(ranges, "start_ns"), _ints(ranges, "end_eff")
        closes = 2 * end + 2 * (end == start)  # the keys of _depths
        carried = ranges.filter(from_numpy(closes > 2 * start.max() + 1))


def cut_points(con: duckdb.DuckDBPyConnection, column: str, rows: str, params: list) -> list:
    """The least value of `column` over `rows` (SQL after FROM), then values that split them into pieces of
    at most about `CHUNK_RANGES` rows each: quantiles, which DuckDB finds without a sort."""
    n = con.execute(f"SELECT count(*) FROM {rows}", params).fetchall()[0][0]
    pieces = -(-n // CHUNK_RANGES)
    fractions = ", ".join(str(i / pieces) for i in range(pieces))
    cuts = con.execute(f"SELECT quantile_disc({column}, [{fractions}]) FROM {rows}", params).fetchall()[0][0]
    return sorted(set(cuts or []))


def _fetch(con: duckdb.DuckDBPyConnection, where: str, params: list) -> pa.Table:
    return con.sql("SELECT _row, range_id, global_tid, start_ns, end_eff FROM _nvtx_range_numbered "
                   f"WHERE is_push_pop AND {where}", params=params).to_arrow_table()


def _insert(con: duckdb.DuckDBPyConnection, part: pa.Table) -> None:
    con.register("_nvtx_nesting_part", part)
    try:
        con.execute("INSERT INTO _nvtx_push_pop_nesting SELECT * FROM _nvtx_nesting_part")
    finally:
        con.unregister("_nvtx_nesting_part")


def _ints(table: pa.Table, name: str) -> np.ndarray:
    """A column of int64 without NULLs as numpy, from its buffers (pyarrow's to_numpy imports pandas)."""
    chunks = [np.frombuffer(c.buffers()[1], dtype=np.int64, count=len(c), offset=c.offset * 8)
              for c in table.column(name).cast(pa.int64()).chunks]
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)


def _nest(ranges: pa.Table) -> pa.Table:
    """(_row, range_id, depth, parent_range_id) of `ranges` (whole threads), in their stack order."""
    threads = np.sort(pc.unique(ranges.column("global_tid").cast(pa.int64())).to_numpy())  # hashed: no sort of all
    order, thread = _stack_order(_ints(ranges, "range_id"), _ints(ranges, "global_tid"), threads)
    end = _ints(ranges, "end_eff")[order]
    depth = _depths(thread, _ints(ranges, "start_ns")[order], end)
    parent_at = _parents(thread, depth, end)
    del thread, end
    range_id = _ints(ranges, "range_id")[order]
    parent = from_numpy(range_id[np.maximum(parent_at, 0)], parent_at < 0)
    del parent_at
    row = ranges.column("_row").take(from_numpy(order))
    return pa.Table.from_arrays([row, from_numpy(range_id), from_numpy(depth.astype(np.int32)), parent], schema=_SCHEMA)


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
