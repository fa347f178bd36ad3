"""How a PyTorch profiler trace's ranges nest: record_function ranges and Python frames together, per thread,
and which of them encloses each CPU op.

Frames nest among themselves (the interpreter's call stack) and so do record_function ranges (the
profiler's own stack), but the two only mostly nest with each other: a range opened by a `with` block
starts inside the frames of its `__enter__` and ends inside those of its `__exit__`. So each family is
nested on its own, as push/pop ranges are (`nesting.py`'s keys: at one instant closes of ranges that have a
length, then opens, then closes of zero-length ranges, then the starts of ops), and each range and op
then has two candidates: the innermost range of each family that encloses it. Its parent is the inner
of the two where one encloses the other, else the one of its own family (a frame's, or an op's, is a
frame): a frame called from inside `__enter__` after the range began stays the child of `__enter__`, as
the trace's `Python parent id` says. A range's depth is the number of its ancestors.
"""
from __future__ import annotations

import duckdb
import numpy as np

FRAME, ANNOTATION, OP = 0, 1, 2
_POSITION_BITS = 40  # an element's position among all ranges and ops: up to 2**40 of them


def create_kineto_nesting(con: duckdb.DuckDBPyConnection, elements: str, table: str) -> None:
    """The temporary table `table` (id, depth, parent_range_id) of the rows of `elements` (SQL: kind, id,
    global_tid, start_ns, end_ns, order_key), where kind is FRAME, ANNOTATION or OP and id is a range's
    range_id or an op's own id; depth is NULL for ops."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (id BIGINT, depth INTEGER, parent_range_id BIGINT)")
    rows = con.sql(f"SELECT kind::BIGINT AS kind, id::BIGINT AS id, global_tid::BIGINT AS global_tid, "
                   f"start_ns::BIGINT AS start_ns, end_ns::BIGINT AS end_ns FROM ({elements}) "
                   "ORDER BY global_tid, start_ns, kind = 2, end_ns DESC, order_key").fetchnumpy()
    kind, ids, tid, start, end = (np.asarray(rows[name], dtype=np.int64)
                                  for name in ("kind", "id", "global_tid", "start_ns", "end_ns"))
    if not kind.size:
        return
    parent, depth = nest(kind, tid, start, end)
    # -1 stands for NULL on the way in: a depth is never negative, and a parent is a range (ids from 1 up)
    nested = {"id": ids, "depth": np.where(kind == OP, -1, depth).astype(np.int32),
              "parent_range_id": np.where(parent >= 0, ids[np.maximum(parent, 0)], -1)}
    con.execute(f"INSERT INTO {table} SELECT id, nullif(depth, -1), nullif(parent_range_id, -1) FROM nested")


def nest(kind: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent position or -1, depth) of each element, given in stack order: by thread, then start, ranges before
    ops, then longest first (the order of range_id within a thread)."""
    thread = np.r_[0, np.cumsum(tid[1:] != tid[:-1])]
    base = int(start.min())
    span = 4 * (int(max(start.max(), end.max())) - base) + 4
    if thread[-1] and span * (int(thread[-1]) + 1) >= 2**63:  # too far apart to offset by thread: one at a time
        return _by_thread(kind, tid, start, end, thread)
    offset = thread * span
    open_key = 4 * (start - base) + np.where(kind == OP, 3, 1) + offset
    close_key = 4 * (end - base) + np.where(end > start, 0, 2) + offset
    inner = {family: _innermost(family, kind, thread, open_key, close_key, end) for family in (FRAME, ANNOTATION)}
    own = np.where(kind == ANNOTATION, inner[ANNOTATION], inner[FRAME])
    other = np.where(kind == ANNOTATION, inner[FRAME], inner[ANNOTATION])
    o, s = np.maximum(other, 0), np.maximum(own, 0)
    other_inside = (other >= 0) & ((own < 0) | ((start[s] <= start[o]) & (end[s] >= end[o]) & (s < o)))
    parent = np.where(other_inside, other, own)
    return parent, _depths(parent)


def _innermost(family: int, kind: np.ndarray, thread: np.ndarray, open_key: np.ndarray, close_key: np.ndarray,
               end: np.ndarray) -> np.ndarray:
    """Position of the innermost range of `family` that encloses each element (-1 for none).

    The family's ranges open before an element (fewer positions) less those closed before it (smaller keys)
    are open at its start: so many, less one, is the depth of the innermost of them, the one of that depth
    opened last before it. Where it ends before the element does, its own candidate is tried, and so on up."""
    members = np.flatnonzero(kind == family)
    position = np.arange(len(kind), dtype=np.int64)
    if not len(members):
        return np.full(len(kind), -1, dtype=np.int64)
    opened = np.searchsorted(members, position)
    closed = np.searchsorted(np.sort(close_key[members]), open_key)
    level = opened - closed  # ranges of the family open just before each element
    keys = np.sort((level[members] << _POSITION_BITS) | members)
    found = np.searchsorted(keys, ((level - 1) << _POSITION_BITS) | position) - 1
    at = keys[np.maximum(found, 0)]
    candidate = at & ((1 << _POSITION_BITS) - 1)
    ok = (found >= 0) & (level >= 1) & ((at >> _POSITION_BITS) == level - 1) & (thread[candidate] == thread)
    candidate[~ok] = -1
    up = candidate.copy()  # each member's own candidate: its parent in the family, where the family nests
    while (short := np.flatnonzero((candidate >= 0) & (end[np.maximum(candidate, 0)] < end))).size:
        candidate[short] = up[candidate[short]]
    return candidate


def _depths(parent: np.ndarray) -> np.ndarray:
    """Each element's number of ancestors, by pointer jumping (log2 of the deepest depth passes)."""
    depth = (parent >= 0).astype(np.int64)
    jump = parent.copy()
    while (active := np.flatnonzero(jump >= 0)).size:
        above = jump[active]
        depth[active] += depth[above]
        jump[active] = jump[above]
    return depth


def _by_thread(kind: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray,
               thread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bounds = np.r_[0, np.flatnonzero(np.diff(thread)) + 1, len(kind)]
    parents, depths = [], []
    for first, last in zip(bounds[:-1], bounds[1:]):
        parent, depth = nest(kind[first:last], tid[first:last], start[first:last], end[first:last])
        parents.append(np.where(parent >= 0, parent + first, -1))
        depths.append(depth)
    return np.concatenate(parents), np.concatenate(depths)

