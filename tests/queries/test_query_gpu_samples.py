"""iterations, host_gaps and host_gaps_parts on real GPU captures agree with a plain-Python computation from raw rows.

The generic mapping is pointed at `aten::linear` ranges, a top-level op range that repeats and
launches GPU work (in two of the captures some launch none: those steps have no device interval). The check
recomputes everything from rows read with plain SELECTs: step ranges and leaves from nvtx_ranges,
CUDA API calls from nsys.CUPTI_ACTIVITY_KIND_RUNTIME, GPU work from the raw kernel, memcpy and
memset tables, joined by correlation id within a process. A gap's idle time is the gap less the
union of its process's GPU work on every device and stream, computed here by a sweep over raw rows.
"""
from __future__ import annotations

import bisect
import re
from collections import defaultdict
from pathlib import Path

import duckdb
import pytest
from query_fixtures import create_statements

from itertrace.ingest import ingest, normalized_tables
from itertrace.queries import QueryDB

SAMPLES = Path(__file__).parents[2] / ".." / "shared" / "nsys_samples"
NAMES = ("h100_2gpu_1s_pqtdir", "mfu_2gpu_before_pqtdir", "mfu_2gpu_after_pqtdir")
STEP = r"^aten::linear, (seq = \d+, )?op_id = \d+$"
PARAMS = {"preset": "generic", "step_pattern": STEP}  # numbered by order; every leaf range is a phase
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
BACKTRACE = 67  # eventClass of the second runtime row some nsys versions write per call
PID_MASK = ~0xFFFFFF

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"real nsys exports not found at {SAMPLES.resolve()}"),
]


@pytest.fixture(scope="module", params=NAMES)
def sample(request, tmp_path_factory):
    """(raw connection, QueryDB with the generic mapping) over one ingested capture."""
    db = tmp_path_factory.mktemp("gpu") / f"{request.param}.duckdb"
    ingest([SAMPLES / request.param], db)
    with QueryDB(db, PARAMS) as queries:
        yield queries.con, queries


def select(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def expected_iterations(con) -> list[tuple]:
    """(iteration, global_tid, step_range_id, host_start_ns, host_end_ns, device_start_ns, device_end_ns,
    device_source, gpu_op_count, first_launch_ns) for every step range, from raw rows."""
    gpu_work = defaultdict(list)  # (process, correlation id) -> [(start, end)]
    present = {row[0] for row in select(con, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'nsys'")}
    for table in GPU_TABLES:
        if table in present:
            for start, end, correlation, pid in select(
                    con, f'SELECT start, "end", correlationId, globalPid FROM nsys.{table}'):
                gpu_work[pid, correlation].append((start, end))
    calls = defaultdict(list)  # thread -> [(start, end, ops it launched)], by start
    for start, end, tid, correlation, event_class in select(
            con, 'SELECT start, "end", globalTid, correlationId, eventClass FROM nsys.CUPTI_ACTIVITY_KIND_RUNTIME'):
        if event_class != BACKTRACE:
            calls[tid].append((start, end, gpu_work.get((tid & PID_MASK, correlation), [])))
    for rows in calls.values():
        rows.sort(key=lambda c: c[0])

    steps = defaultdict(list)
    for range_id, start, end, text, tid in select(
            con, "SELECT range_id, start_ns, end_ns, text, global_tid FROM nvtx_ranges"):
        if re.search(STEP, text):
            steps[tid].append((start, range_id, end))
    out = []
    for tid, rows in steps.items():
        starts = [c[0] for c in calls[tid]]
        for iteration, (start, range_id, end) in enumerate(sorted(rows)):
            assert end is not None  # every step range closed in these captures
            ops, first_launch = [], None
            for call_start, call_end, launched in calls[tid][bisect.bisect_left(starts, start):]:
                if call_start > end:
                    break
                if call_end <= end and launched:
                    ops += launched
                    first_launch = call_start if first_launch is None else first_launch
            device = (min(s for s, _ in ops), max(e for _, e in ops), "gpu") if ops else (None, None, None)
            out.append((iteration, tid, range_id, start, end, *device, len(ops), first_launch))
    return sorted(out, key=lambda r: (r[1], r[0]))


def process_busy(con) -> dict[int, list[tuple[int, int]]]:
    """Per process, the union of its GPU work (kernels, copies, sets of positive length) as disjoint intervals."""
    present = {row[0] for row in select(con, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'nsys'")}
    ops = defaultdict(list)
    for table in GPU_TABLES:
        if table in present:
            for start, end, pid in select(con, f'SELECT start, "end", globalPid FROM nsys.{table} WHERE "end" > start'):
                ops[pid].append((start, end))
    busy = {}
    for pid, rows in ops.items():
        merged = []
        for start, end in sorted(rows):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        busy[pid] = [tuple(m) for m in merged]
    return busy


def idle_pieces(start: int, end: int, busy: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) less the busy intervals, as pieces in order."""
    pieces, at = [], start
    for b_start, b_end in busy[bisect.bisect_right([e for _, e in busy], start):]:
        if b_start >= end:
            break
        if b_start > at:
            pieces.append((at, b_start))
        at = max(at, b_end)
    if at < end:
        pieces.append((at, end))
    return pieces


def expected_gaps(con, iterations: list[tuple]) -> list[tuple]:
    """(global_tid, prev_iteration, iteration, gap_start_ns, gap_end_ns, idle pieces) per track."""
    busy = process_busy(con)
    tracks = defaultdict(list)
    for iteration, tid, _, _, _, device_start, device_end, *_ in iterations:
        if device_start is not None:
            tracks[tid].append((device_start, iteration, device_end))
    out = []
    for tid, rows in tracks.items():
        rows.sort()
        busy_until, busy_iteration = rows[0][2], rows[0][1]
        for start, iteration, end in rows[1:]:
            gap_start = min(busy_until, start)
            out.append((tid, busy_iteration, iteration, gap_start, start,
                        idle_pieces(gap_start, start, busy.get(tid & PID_MASK, []))))
            if end > busy_until:
                busy_until, busy_iteration = end, iteration
    return sorted(out)


def with_gap_ns(gaps: list[tuple]) -> list[tuple]:
    return [(*g[:5], sum(e - s for s, e in g[5])) for g in gaps]


def expected_parts(con, gaps: list[tuple]) -> list[tuple]:
    """(global_tid, iteration, phase, dur_ns): each gap's idle pieces split among the leaf ranges of its track's thread."""
    ranges = select(con, "SELECT range_id, start_ns, end_ns, text, global_tid, parent_range_id, range_kind "
                         "FROM nvtx_ranges")
    parents = {r[5] for r in ranges}
    leaves = defaultdict(list)  # thread -> [(start, end, phase)], by start; leaves on a thread never overlap
    for range_id, start, end, text, tid, _, kind in ranges:
        if kind == "push_pop" and range_id not in parents:
            leaves[tid].append((start, end, re.sub(r"[0-9]+", "#", text)))
    for rows in leaves.values():
        rows.sort()
    out = []
    for tid, _, iteration, _, _, pieces in gaps:
        parts = defaultdict(int)
        ends = [end for _, end, _ in leaves[tid]]
        for piece_start, piece_end in pieces:
            for start, end, phase in leaves[tid][bisect.bisect_right(ends, piece_start):]:
                if start >= piece_end:
                    break
                parts[phase] += min(end, piece_end) - max(start, piece_start)
        out += [(tid, iteration, phase, ns) for phase, ns in parts.items()]
        out.append((tid, iteration, "unattributed", sum(e - s for s, e in pieces) - sum(parts.values())))
    return sorted(out)


def test_fixture_tables_match_what_ingest_creates(sample):
    con, _ = sample
    fixture = duckdb.connect()
    for statement in create_statements():
        fixture.execute(statement)
    # Tables and the normalized views (a fixture holds those as tables), not the hidden tables the views
    # read nor the query views installed on this connection.
    views = ", ".join(f"'{name}'" for name in normalized_tables())
    columns = ("SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE schema_name = 'main' "
               "AND (table_name IN (SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main') "
               f"OR table_name IN ({views})) AND NOT starts_with(table_name, '_')")
    ingested = set(select(con, columns))
    assert ingested <= set(select(fixture, columns))
    assert {t for t, _, _ in ingested} >= {"nvtx_ranges", "nvtx_marks", "nvtx_gpu_projection", "cuda_api", "gpu_ops"}


def test_iterations_device_interval_is_the_gpu_work_launched_inside_each_step(sample):
    con, queries = sample
    expected = expected_iterations(con)
    assert sum(1 for r in expected if r[7] == "gpu") > 50
    actual = queries.sql("SELECT iteration, global_tid, step_range_id, host_start_ns, host_end_ns, device_start_ns, "
                         "device_end_ns, device_source, gpu_op_count, first_launch_ns FROM iterations "
                         "ORDER BY global_tid, iteration")
    assert [tuple(r.values()) for r in actual.to_pylist()] == expected


def test_host_gaps_between_device_intervals(sample):
    con, queries = sample
    actual = sorted(tuple(r.values()) for r in queries.query("host_gaps").to_pylist())
    expected = with_gap_ns(expected_gaps(con, expected_iterations(con)))
    assert actual == expected
    assert sum(1 for g in expected if 0 < g[5] < g[4] - g[3]) > 0  # some gap is partly busy with other GPU work


def test_host_gaps_parts_split_each_gap_among_leaf_ranges(sample):
    con, queries = sample
    expected = expected_parts(con, expected_gaps(con, expected_iterations(con)))
    actual = sorted(tuple(r.values()) for r in queries.query("host_gaps_parts").to_pylist())
    assert actual == expected


def test_host_gaps_parts_add_up_to_each_gap(sample):
    _, queries = sample
    gaps = {(r["global_tid"], r["iteration"]): r["gap_ns"] for r in queries.query("host_gaps").to_pylist()}
    sums = defaultdict(int)
    for r in queries.query("host_gaps_parts").to_pylist():
        sums[r["global_tid"], r["iteration"]] += r["dur_ns"]
    assert sums == gaps
    assert sum(gaps.values()) > 0
