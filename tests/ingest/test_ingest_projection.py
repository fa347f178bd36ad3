"""The GPU projection (a walk up the nesting, an interval join for the rest) against pairs counted in Python."""
from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from itertrace.ingest import nesting as nesting_module
from test_ingest_nesting import PROCESS_100, THREAD_A, THREAD_B, database, nvtx, push_pop_sequences


@st.composite
def captures(draw):
    """NVTX rows (push/pop, start/end, and on some draws ranges that cross, as no stack makes them), and
    API calls on both threads, zero-length ones included, each launching one or two kernels."""
    rows = draw(push_pop_sequences())
    for _ in range(draw(st.integers(0, 2))):  # crossing ranges: the thread then has no stack
        start = draw(st.integers(0, 40))
        rows.append((59, start, start + draw(st.integers(0, 20)), draw(st.sampled_from([THREAD_A, THREAD_B])),
                     f"x{len(rows)}"))
    calls = []
    for i in range(draw(st.integers(0, 30))):
        start = draw(st.integers(0, 45))
        calls.append((start, start + draw(st.sampled_from([0, 0, 1, 2, 5])), draw(st.sampled_from([THREAD_A, THREAD_B])),
                      i + 1, draw(st.integers(1, 2))))
    return rows, calls


def tables(rows, calls) -> dict[str, pa.Table]:
    kernels = [(1000 + 10 * corr + k, 1005 + 10 * corr + k, corr) for _, _, _, corr, n in calls for k in range(n)]
    return {
        "NVTX_EVENTS": nvtx(*rows),
        "CUPTI_ACTIVITY_KIND_RUNTIME": pa.table({
            "start": pa.array([c[0] for c in calls], pa.int64()), "end": pa.array([c[1] for c in calls], pa.int64()),
            "eventClass": pa.array([0] * len(calls), pa.uint32()),
            "globalTid": pa.array([c[2] for c in calls], pa.uint64()),
            "correlationId": pa.array([c[3] for c in calls], pa.uint32()),
            "nameId": pa.array([0] * len(calls), pa.uint64()), "returnValue": pa.array([0] * len(calls), pa.uint32())}),
        "CUPTI_ACTIVITY_KIND_KERNEL": pa.table({
            "start": pa.array([k[0] for k in kernels], pa.int64()), "end": pa.array([k[1] for k in kernels], pa.int64()),
            "deviceId": pa.array([0] * len(kernels), pa.uint32()), "streamId": pa.array([7] * len(kernels), pa.uint64()),
            "correlationId": pa.array([k[2] for k in kernels], pa.uint32()),
            "globalPid": pa.array([PROCESS_100] * len(kernels), pa.uint64()),
            "demangledName": pa.array([0] * len(kernels), pa.uint64()),
            "shortName": pa.array([0] * len(kernels), pa.uint64())}),
        "StringIds": pa.table({"id": pa.array([0], pa.int32()), "value": pa.array([b"k"], pa.binary())}),
    }


def expected(rows, calls) -> dict[str, tuple]:
    """text -> (gpu_start, gpu_end, ops, launches): every call that starts and ends inside the range, on its thread."""
    trace_end = max((max(r[1], r[2] if r[2] is not None else r[1]) for r in rows), default=0)
    out: dict[str, list] = defaultdict(list)
    for _, start, end, thread, text in rows:
        end = trace_end if end is None else end
        for c_start, c_end, c_thread, corr, n in calls:
            if c_thread == thread and start <= c_start and c_end <= end:
                out[text].append((1000 + 10 * corr, 1005 + 10 * corr + n - 1, n))
    return {text: (min(s for s, _, _ in hits), max(e for _, e, _ in hits), sum(n for _, _, n in hits), len(hits))
            for text, hits in out.items()}


def projection(con) -> dict[str, tuple]:
    return {text: tuple(rest) for text, *rest in con.execute("""
        SELECT r.text, p.gpu_start_ns, p.gpu_end_ns, p.gpu_op_count, p.launch_count
        FROM nvtx_gpu_projection p JOIN nvtx_ranges r USING (range_id)""").fetchall()}


@settings(max_examples=60, deadline=None)
@given(captures())
def test_projection_matches_every_pair_counted_in_python(capture):
    rows, calls = capture
    assert projection(database(tables(rows, calls))) == expected(rows, calls)


@settings(max_examples=25, deadline=None)
@given(captures(), st.integers(1, 4))
@example(([(59, 0, 1, THREAD_A, "r0"), (59, 0, 1, THREAD_A, "r1")], [(0, 0, THREAD_A, 1, 1)]), 1)  # a span with no ranges
def test_projection_of_a_few_ranges_at_a_time_is_the_same(capture, chunk):
    rows, calls = capture
    was = nesting_module.CHUNK_RANGES
    nesting_module.CHUNK_RANGES = chunk
    try:
        con = database(tables(rows, calls))
    finally:
        nesting_module.CHUNK_RANGES = was
    assert projection(con) == expected(rows, calls)


def test_a_zero_length_call_where_two_ranges_touch_is_inside_both():
    rows = [(59, 0, 10, THREAD_A, "first"), (59, 10, 20, THREAD_A, "second"), (59, 0, 30, THREAD_A, "outer")]
    calls = [(10, 10, THREAD_A, 1, 1), (12, 14, THREAD_A, 2, 1)]
    assert projection(database(tables(rows, calls))) == {
        "first": (1010, 1015, 1, 1), "second": (1010, 1025, 2, 2), "outer": (1010, 1025, 2, 2)}
