"""NVTX nesting and GPU projection on hand-made NVTX_EVENTS, CUDA API and kernel rows."""
from __future__ import annotations

from collections import defaultdict

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from itertrace.ingest import nesting as nesting_module
from itertrace.ingest.normalize import build_normalized

THREAD_A = (1 << 48) | (100 << 24) | 100  # hw 0, vm 1, pid 100, tid 100
THREAD_B = (1 << 48) | (100 << 24) | 101
THREAD_C = (1 << 48) | (200 << 24) | 200  # another process
PROCESS_100 = THREAD_A & ~0xFFFFFF
PROCESS_200 = THREAD_C & ~0xFFFFFF


def nvtx(*rows: tuple) -> pa.Table:
    """NVTX_EVENTS from (eventType, start, end, globalTid, text) rows, typed as nsys 2022.4 writes them."""
    columns = list(zip(*rows)) if rows else [[]] * 5
    return pa.table({
        "start": pa.array(columns[1], pa.int64()),
        "end": pa.array(columns[2], pa.int64()),
        "eventType": pa.array(columns[0], pa.uint32()),
        "globalTid": pa.array(columns[3], pa.uint64()),
        "text": pa.array([t.encode() if t is not None else None for t in columns[4]], pa.binary()),
    })


def database(tables: dict[str, pa.Table]) -> duckdb.DuckDBPyConnection:
    """An in-memory database with `tables` as raw nsys tables and the normalized tables built."""
    con = duckdb.connect()
    con.execute("CREATE SCHEMA nsys")
    for name, table in tables.items():
        con.register("_t", table)
        con.execute(f'CREATE TABLE nsys."{name}" AS SELECT * FROM _t')
        con.unregister("_t")
    build_normalized(con, "nsys", "test", "arrow")
    return con


def nesting(con) -> list[tuple]:
    return con.execute("""
        SELECT r.text, r.depth, p.text FROM nvtx_ranges r LEFT JOIN nvtx_ranges p ON p.range_id = r.parent_range_id
        ORDER BY r.range_id""").fetchall()


def test_push_pop_ranges_nest_per_thread():
    con = database({"NVTX_EVENTS": nvtx(
        (59, 0, 100, THREAD_A, "step"),
        (59, 10, 40, THREAD_A, "schedule"),
        (59, 40, 90, THREAD_A, "forward"),  # touches schedule: a sibling, not its child
        (59, 50, 60, THREAD_A, "attention"),
        (59, 60, 60, THREAD_A, "zero"),  # zero length, at the instant attention ends: inside forward
        (59, 5, 95, THREAD_B, "other-thread"),  # overlaps step in time, on another thread
        (60, 20, 70, THREAD_A, "start-end"),  # start/end: no part in nesting
        (59, 200, None, THREAD_A, "open"),  # never popped
        (34, 30, None, THREAD_A, "mark"),
    )})
    assert nesting(con) == [
        ("step", 0, None),
        ("other-thread", 0, None),
        ("schedule", 1, "step"),
        ("start-end", None, None),
        ("forward", 1, "step"),
        ("attention", 2, "forward"),
        ("zero", 2, "forward"),
        ("open", 0, None),
    ]
    assert con.execute("SELECT end_ns, dur_ns FROM nvtx_ranges WHERE text = 'open'").fetchone() == (None, None)
    assert con.execute("SELECT ts_ns, text FROM nvtx_marks").fetchall() == [(30, "mark")]


def test_tables_exist_when_the_export_has_none_of_their_sources():
    con = database({"NVTX_EVENTS": nvtx()})
    for table in ("nvtx_ranges", "nvtx_marks", "gpu_ops", "cuda_api", "nvtx_gpu_projection", "threads", "processes"):
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    assert con.execute("SELECT source, nsys_version FROM capture_meta").fetchall() == [("test", None)]


def test_gpu_projection_follows_nsight():
    runtime = pa.table({
        "start": pa.array([10, 20, 30, 95, 20, 20], pa.int64()),
        "end": pa.array([12, 22, 32, 105, 22, 22], pa.int64()),
        "eventClass": pa.array([0, 0, 0, 0, 67, 0], pa.uint32()),
        "globalTid": pa.array([THREAD_A, THREAD_A, THREAD_A, THREAD_A, THREAD_A, THREAD_C], pa.uint64()),
        "correlationId": pa.array([1, 2, 3, 4, 2, 2], pa.uint32()),
        "nameId": pa.array([0, 0, 0, 0, 0, 0], pa.uint64()),
        "returnValue": pa.array([0] * 6, pa.uint32()),
    })
    kernels = pa.table({
        "start": pa.array([500, 600, 610, 700, 900, 5000], pa.int64()),
        "end": pa.array([550, 605, 640, 710, 950, 5001], pa.int64()),
        "deviceId": pa.array([0] * 6, pa.uint32()),
        "streamId": pa.array([7] * 6, pa.uint64()),
        "correlationId": pa.array([1, 2, 2, 3, 4, 2], pa.uint32()),  # 2 is a graph: two kernels
        "globalPid": pa.array([PROCESS_100] * 5 + [PROCESS_200], pa.uint64()),
        "demangledName": pa.array([0] * 6, pa.uint64()),
        "shortName": pa.array([0] * 6, pa.uint64()),
    })
    con = database({
        "NVTX_EVENTS": nvtx(
            (59, 0, 100, THREAD_A, "step"),  # calls 1, 2, 3 inside; call 4 straddles the end
            (59, 15, 25, THREAD_A, "launch-graph"),
            (59, 40, 50, THREAD_A, "no-gpu"),
            (59, 0, 100, THREAD_B, "other-thread"),
        ),
        "CUPTI_ACTIVITY_KIND_RUNTIME": runtime,
        "CUPTI_ACTIVITY_KIND_KERNEL": kernels,
        "StringIds": pa.table({"id": pa.array([0], pa.int32()), "value": pa.array([b"k"], pa.binary())}),
    })
    assert con.execute("""
        SELECT r.text, p.gpu_start_ns, p.gpu_end_ns, p.gpu_dur_ns, p.gpu_op_count, p.launch_count
        FROM nvtx_gpu_projection p JOIN nvtx_ranges r USING (range_id) ORDER BY r.range_id""").fetchall() == [
        ("step", 500, 710, 210, 4, 3),
        ("launch-graph", 600, 640, 40, 2, 1),
    ]


@st.composite
def push_pop_sequences(draw):
    """NVTX rows made by running random push/pop calls on two threads, ties and zero-length ranges included."""
    rows, time = [], 0
    stacks: dict[int, list[int]] = {THREAD_A: [], THREAD_B: []}
    for _ in range(draw(st.integers(0, 40))):
        time += draw(st.integers(0, 2))
        thread = draw(st.sampled_from(sorted(stacks)))
        if stacks[thread] and draw(st.booleans()):
            rows[stacks[thread].pop()][2] = time
        else:
            stacks[thread].append(len(rows))
            rows.append([draw(st.sampled_from([59, 59, 59, 60])), time, None, thread, f"r{len(rows)}"])
    for stack in stacks.values():  # close most of what is still open, leave some ranges open
        for index in stack[draw(st.integers(0, len(stack))):]:
            rows[index][2] = time + 1
    return [tuple(r) for r in rows]


@settings(max_examples=25, deadline=None)
@given(push_pop_sequences())
def test_nesting_matches_a_stack_on_random_push_pop_calls(rows):
    con = database({"NVTX_EVENTS": nvtx(*rows)})
    got = {text: (depth, parent) for text, depth, parent in nesting(con)}
    assert got == stack_nesting(rows)


@settings(max_examples=25, deadline=None)
@given(push_pop_sequences(), st.integers(1, 4))
def test_nesting_computed_a_few_ranges_at_a_time_is_the_same(rows, chunk):
    # Thread groups of at most `chunk` ranges (one thread per group where a thread has more).
    was = nesting_module.CHUNK_RANGES
    nesting_module.CHUNK_RANGES = chunk
    try:
        con = database({"NVTX_EVENTS": nvtx(*rows)})
    finally:
        nesting_module.CHUNK_RANGES = was
    got = {text: (depth, parent) for text, depth, parent in nesting(con)}
    assert got == stack_nesting(rows)


def stack_nesting(rows: list[tuple]) -> dict[str, tuple]:
    """text -> (depth, parent text) by replaying each thread's push/pop ranges on a stack."""
    trace_end = max((max(r[1], r[2] if r[2] is not None else r[1]) for r in rows), default=0)
    by_thread = defaultdict(list)
    out = {}
    for order, (kind, start, end, thread, text) in enumerate(rows):
        if kind == 60:
            out[text] = (None, None)
        else:
            by_thread[thread].append((start, -(end if end is not None else trace_end), order, text))
    for ranges in by_thread.values():
        stack: list[tuple[int, int, str]] = []
        for start, neg_end, _, text in sorted(ranges):
            end = -neg_end
            while stack and (stack[-1][1] < start or (stack[-1][1] == start and stack[-1][1] > stack[-1][0])):
                stack.pop()
            out[text] = (len(stack), stack[-1][2] if stack else None)
            stack.append((start, end, text))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2), st.integers(0, 4), st.booleans(), st.booleans()),
                min_size=1, max_size=40), st.booleans(), st.booleans())
def test_range_order_is_a_sort_by_every_key(ranges, presorted, nulls):
    # The sort by start, then by every key among ties only, against one sort by every key (as SQL's
    # ORDER BY start NULLS LAST, global_tid NULLS LAST, end DESC, raw row); NULLs in some examples only,
    # since any one takes the sort by every key.
    import numpy as np
    if presorted:
        ranges = sorted(ranges)
    start, tid, length, tid_null, start_null = (np.array(c) for c in zip(*ranges))
    tid_null, start_null = tid_null & nulls, start_null & nulls
    row = np.arange(len(ranges))[::-1].copy()
    end = start + length
    want = np.lexsort((row, -end, tid, tid_null, start, start_null))
    got = nesting_module._range_order(row, tid, start, end, tid_null, start_null)
    assert got.tolist() == want.tolist()
