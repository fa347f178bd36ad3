"""Diff tests of queries/gpu_time.sql, gpu_idle_parts.sql and host_activity.sql: busy and idle per GPU, by cause.

Each case is a handful of rows in the normalized tables and the exact rows expected; a property test
checks random captures against the plain-Python accounting of gpu_time_reference.py.
"""
from __future__ import annotations

from collections import Counter

import pytest
from gpu_time_reference import CUDA, NVTX, HostInterval, accounting, api_class, clipped_calls, leaves
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from query_fixtures import PID_100, PID_200, TID_A, TID_B, TID_C, TraceDB, frame, pid_of, projection, push_pop

from itertrace.errors import UserError

LAUNCH, COPY, SYNC = "cudaLaunchKernel_v7000", "cudaMemcpyAsync_v3020", "cudaStreamSynchronize_v3020"
GENERIC = {"preset": "generic", "step_pattern": "^step$", "iteration_from": "order"}  # every leaf range is a phase


@pytest.fixture(scope="module")
def trace():
    with TraceDB() as db:
        yield db


def call(n: int, start_ns: int, end_ns: int, name: str = LAUNCH, *, tid: int = TID_A) -> dict:
    """A cuda_api row with correlation id n."""
    return {"api_id": n, "start_ns": start_ns, "end_ns": end_ns, "dur_ns": end_ns - start_ns, "name": name,
            "global_tid": tid, "global_pid": pid_of(tid), "correlation_id": n}


def op(n: int, start_ns: int, end_ns: int, *, device: int = 0, stream: int = 7, kind: str = "kernel",
       pid: int = PID_100, name: str = "k") -> dict:
    """A gpu_ops row launched by the call with correlation id n."""
    return {"gpu_op_id": n, "kind": kind, "start_ns": start_ns, "end_ns": end_ns, "dur_ns": end_ns - start_ns,
            "name": name, "short_name": name, "device_id": device, "stream_id": stream, "correlation_id": n,
            "global_pid": pid}


def launch(n: int, call_ns: tuple[int, int], gpu_ns: tuple[int, int], *, tid: int = TID_A, **op_args) -> dict:
    return {"cuda_api": [call(n, *call_ns, COPY if op_args.get("kind") == "memcpy" else LAUNCH, tid=tid)],
            "gpu_ops": [op(n, *gpu_ns, pid=pid_of(tid), **op_args)]}


def merge(*parts: dict) -> dict[str, list[dict]]:
    tables: dict[str, list[dict]] = {}
    for part in parts:
        for table, rows in part.items():
            tables.setdefault(table, []).extend(rows)
    return tables


SPAN = "kineto trace span"


def recorded(tables: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """`tables` with a profiler span for every process with GPU work, from the first to the last instant any
    of its rows holds: the window is then the capture's, not only its GPU work's."""
    times = [(r["start_ns"], r["end_ns"]) for t in ("nvtx_ranges", "cuda_api", "gpu_ops") for r in tables.get(t, [])]
    lo, hi = min(a for a, _ in times), max(b for _, b in times)
    pids = sorted({o["global_pid"] for o in tables["gpu_ops"]})
    return {**tables, "capture_spans": [{"global_pid": pid, "start_ns": lo, "end_ns": hi, "source": SPAN}
                                        for pid in pids]}


# Two streams overlapping and a memcpy overlapping a kernel: busy is [10, 50) and [70, 80), once.
STREAMS = recorded(merge(launch(1, (0, 5), (10, 30), stream=1), launch(2, (5, 8), (20, 40), stream=2),
                launch(3, (8, 9), (35, 50), stream=3, kind="memcpy"), launch(4, (60, 62), (70, 80))))

# Two iterations of this engine: idle before the first, inside the first, between them, after the last.
ITERATIONS = recorded(merge(
    {"nvtx_ranges": [push_pop(1, "init", 0, 8),
                     push_pop(2, "step", 10, 50, payload=0), push_pop(3, "sample", 46, 50, parent=2, depth=1),
                     push_pop(4, "step", 50, 90, payload=1), push_pop(5, "schedule", 50, 55, parent=4, depth=1)],
     "nvtx_gpu_projection": [projection(2, 20, 45, 2), projection(4, 60, 80, 1)]},
    launch(1, (12, 14), (20, 30)), launch(2, (16, 18), (35, 45)), launch(3, (52, 54), (60, 80)),
    {"cuda_api": [call(4, 56, 58, "cudaFuncGetAttributes_v9000")]}))

# A stream synchronize that returns long after the kernel it waits for ended.
SYNC_CALL = recorded(merge(launch(1, (0, 2), (5, 20)), {"cuda_api": [call(2, 3, 30, SYNC)]}, launch(3, (31, 33), (35, 40))))

# Leaf ranges on two threads of one process: thread A launches, so where both are in a range, A's wins.
TWO_THREADS = recorded(merge(
    {"nvtx_ranges": [push_pop(1, "tokenize", 5, 15, tid=TID_B, domain=None),
                     push_pop(2, "prepare", 10, 20, domain=None),
                     push_pop(3, "detokenize", 30, 45, tid=TID_B, domain=None)]},
    launch(1, (0, 2), (2, 8)), launch(2, (20, 22), (25, 35))))

# Two GPUs used by process 100, and GPU 1 used by process 200 as well.
TWO_GPUS = recorded(merge(launch(1, (0, 1), (10, 20), device=0), launch(2, (1, 2), (15, 30), device=1),
                 launch(3, (0, 1), (2, 5), device=1, tid=TID_C)))


def test_two_streams_and_a_memcpy_count_their_overlap_once(trace):
    trace.load(STREAMS)
    assert trace.query("gpu_time", GENERIC) == [(0, PID_100, 100, 0, 80, 80, 4, 50, 30, 0, 0, 30, 0.625, 0, SPAN)]
    assert trace.query("gpu_time_idle", GENERIC) == [(0, PID_100, 0, 10, 10, "outside", None),
                                                     (0, PID_100, 50, 70, 20, "outside", None)]
    assert trace.query("gpu_idle_parts", GENERIC) == [
        (0, PID_100, 0, 10, "outside", None, "cuda_launch", LAUNCH, TID_A, 8, None),
        (0, PID_100, 0, 10, "outside", None, "cuda_memcpy", COPY, TID_A, 1, None),
        (0, PID_100, 0, 10, "outside", None, "unattributed", "unattributed", None, 1, None),
        (0, PID_100, 50, 70, "outside", None, "cuda_launch", LAUNCH, TID_A, 2, None),
        (0, PID_100, 50, 70, "outside", None, "unattributed", "unattributed", None, 18, None)]


def test_idle_before_inside_between_and_after_iterations(trace):
    trace.load(ITERATIONS)
    assert trace.query("gpu_time") == [(0, PID_100, 100, 0, 90, 90, 3, 40, 50, 5, 15, 30, 40 / 90, 2, SPAN)]
    assert trace.query("gpu_time_idle") == [(0, PID_100, 0, 20, 20, "outside", None),
                                            (0, PID_100, 30, 35, 5, "within", 0),
                                            (0, PID_100, 45, 60, 15, "between", 0),
                                            (0, PID_100, 80, 90, 10, "outside", 1)]
    other = "cudaFuncGetAttributes_v9000"
    assert trace.query("gpu_idle_parts") == [
        (0, PID_100, 0, 20, "outside", None, "cuda_launch", LAUNCH, TID_A, 4, None),
        (0, PID_100, 0, 20, "outside", None, "unattributed", "unattributed", None, 16, None),
        (0, PID_100, 30, 35, "within", 0, "unattributed", "unattributed", None, 5, None),
        (0, PID_100, 45, 60, "between", 0, "cuda_other", other, TID_A, 2, None),
        (0, PID_100, 45, 60, "between", 0, "nvtx", "sample", TID_A, 4, None),
        (0, PID_100, 45, 60, "between", 0, "nvtx", "schedule", TID_A, 5, None),  # its launch at 52 is inside it
        (0, PID_100, 45, 60, "between", 0, "unattributed", "unattributed", None, 4, None),
        (0, PID_100, 80, 90, "outside", 1, "unattributed", "unattributed", None, 10, None)]
    assert trace.query("gpu_time_causes") == [  # idle 50 ns in all
        (0, PID_100, "cuda_launch", LAUNCH, 4, 4 / 50, 0, 0, 4, 1),
        (0, PID_100, "cuda_other", other, 2, 2 / 50, 0, 2, 0, 1),
        (0, PID_100, "nvtx", "sample", 4, 4 / 50, 0, 4, 0, 1),
        (0, PID_100, "nvtx", "schedule", 5, 5 / 50, 0, 5, 0, 1),
        (0, PID_100, "unattributed", "unattributed", 35, 35 / 50, 5, 4, 26, 4)]
    assert trace.query("gpu_time_summary") == [
        (0, PID_100, 90, 40 / 90, 5 / 90, 15 / 90, 30 / 90, "unattributed", "unattributed", 0.7,
         ["unattributed (unattributed): 70.0%", "schedule (nvtx): 10.0%", f"{LAUNCH} (cuda_launch): 8.0%"], SPAN)]


def test_a_sync_call_covering_an_idle_span_is_cuda_sync(trace):
    trace.load(SYNC_CALL)
    assert trace.query("gpu_idle_parts", GENERIC) == [
        (0, PID_100, 0, 5, "outside", None, "cuda_launch", LAUNCH, TID_A, 2, None),
        (0, PID_100, 0, 5, "outside", None, "cuda_sync", SYNC, TID_A, 2, None),
        (0, PID_100, 0, 5, "outside", None, "unattributed", "unattributed", None, 1, None),
        (0, PID_100, 20, 35, "outside", None, "cuda_launch", LAUNCH, TID_A, 2, None),
        (0, PID_100, 20, 35, "outside", None, "cuda_sync", SYNC, TID_A, 10, None),
        (0, PID_100, 20, 35, "outside", None, "unattributed", "unattributed", None, 3, None)]


def test_host_ranges_on_two_threads_the_launching_thread_first(trace):
    trace.load(TWO_THREADS)
    assert trace.query("host_activity", GENERIC) == [
        (PID_100, 0, 2, TID_A, "cuda_launch", LAUNCH, None),
        (PID_100, 5, 10, TID_B, "nvtx", "tokenize", None),
        (PID_100, 10, 15, TID_A, "nvtx", "prepare", None),
        (PID_100, 15, 20, TID_A, "nvtx", "prepare", None),
        (PID_100, 20, 22, TID_A, "cuda_launch", LAUNCH, None),
        (PID_100, 30, 45, TID_B, "nvtx", "detokenize", None)]
    assert trace.query("gpu_idle_parts", GENERIC) == [
        (0, PID_100, 0, 2, "outside", None, "cuda_launch", LAUNCH, TID_A, 2, None),
        (0, PID_100, 0, 2, "outside", None, "unattributed", "unattributed", None, 0, None),
        (0, PID_100, 8, 25, "outside", None, "cuda_launch", LAUNCH, TID_A, 2, None),
        (0, PID_100, 8, 25, "outside", None, "nvtx", "prepare", TID_A, 10, None),
        (0, PID_100, 8, 25, "outside", None, "nvtx", "tokenize", TID_B, 2, None),
        (0, PID_100, 8, 25, "outside", None, "unattributed", "unattributed", None, 3, None),
        (0, PID_100, 35, 45, "outside", None, "nvtx", "detokenize", TID_B, 10, None),
        (0, PID_100, 35, 45, "outside", None, "unattributed", "unattributed", None, 0, None)]


def test_two_gpus_and_two_processes_on_one_gpu_are_accounted_apart(trace):
    trace.load(TWO_GPUS)
    assert trace.query("gpu_time", GENERIC) == [
        (0, PID_100, 100, 0, 30, 30, 1, 10, 20, 0, 0, 20, 1 / 3, 0, SPAN),
        (1, PID_100, 100, 0, 30, 30, 1, 15, 15, 0, 0, 15, 0.5, 0, SPAN),
        (1, PID_200, 200, 0, 30, 30, 1, 3, 27, 0, 0, 27, 0.1, 0, SPAN)]
    causes = trace.sql("SELECT device_id, global_pid, cause_kind, global_tid, sum(dur_ns)::BIGINT FROM gpu_idle_parts "
                       "GROUP BY ALL", GENERIC)
    assert causes == [(0, PID_100, "cuda_launch", TID_A, 2), (0, PID_100, "unattributed", None, 18),
                      (1, PID_100, "cuda_launch", TID_A, 2), (1, PID_100, "unattributed", None, 13),
                      (1, PID_200, "cuda_launch", TID_C, 1), (1, PID_200, "unattributed", None, 26)]


# A process whose NVTX leaf runs on past the next GPU's first idle instants: GPU (0, 100) sorts before
# (0, 200) in the sweep, and its leaf [0, 60) must not stand for process 200's idle time in [0, 10) and
# [20, 30); process 200's own calls [0, 5) and [6, 7) do, where they run.
LEAKING = recorded(merge(
    {"nvtx_ranges": [push_pop(1, "prepare", 0, 60, domain=None)]},
    launch(1, (1, 2), (40, 50)), launch(2, (0, 5), (10, 20), tid=TID_C), launch(3, (6, 7), (30, 40), tid=TID_C)))


def test_a_host_range_of_one_gpu_takes_no_part_in_the_next_gpus_idle_time(trace):
    trace.load(LEAKING)
    assert trace.query("gpu_idle_parts", GENERIC) == [
        (0, PID_100, 0, 40, "outside", None, "nvtx", "prepare", TID_A, 40, None),
        (0, PID_100, 0, 40, "outside", None, "unattributed", "unattributed", None, 0, None),
        (0, PID_100, 50, 60, "outside", None, "nvtx", "prepare", TID_A, 10, None),
        (0, PID_100, 50, 60, "outside", None, "unattributed", "unattributed", None, 0, None),
        (0, PID_200, 0, 10, "outside", None, "cuda_launch", LAUNCH, TID_C, 6, None),
        (0, PID_200, 0, 10, "outside", None, "unattributed", "unattributed", None, 4, None),
        (0, PID_200, 20, 30, "outside", None, "unattributed", "unattributed", None, 10, None),
        (0, PID_200, 40, 60, "outside", None, "unattributed", "unattributed", None, 20, None)]


def test_the_sweep_packs_a_gpu_an_instant_and_an_id_in_order(trace):
    """The packed running values compare by GPU, then instant, whatever the id, and unpack exactly, at the
    ends of BIGINT as well."""
    trace.load(STREAMS)
    lo, hi, top = -(2**63), 2**63 - 1, 2**32 - 1
    cases = [(1, lo, 0), (1, lo, top), (1, -1, 5), (1, 0, top), (1, 0, 0), (1, hi, 0), (2, lo, 0), (2, 7, 3), (3, hi, top)]
    values = ", ".join(f"({g}, ({ns})::BIGINT, {i})" for g, ns, i in cases)
    rows = trace.sql(f"""SELECT g, ns, id, _gpu_idle_parts_ns(v), _gpu_idle_parts_id(v),
                                row_number() OVER (ORDER BY v)::INTEGER
                         FROM (SELECT *, _gpu_idle_parts_key(g, ns, id) AS v FROM (VALUES {values}) AS t(g, ns, id))
                         ORDER BY g, ns, id""")
    assert rows == [(g, ns, i, ns, i, n) for n, (g, ns, i) in enumerate(sorted(cases), 1)]


def test_kernels_by_name(trace):
    trace.load(merge(launch(1, (0, 1), (10, 30), name="gemm"), launch(2, (1, 2), (30, 40), name="gemm"),
                     launch(3, (2, 3), (40, 45), name="softmax", device=1)))
    assert trace.query("gpu_time_kernels", GENERIC) == [("kernel", "gemm", 2, 1, 30, 30 / 35, 15.0, 20),
                                                        ("kernel", "softmax", 1, 1, 5, 5 / 35, 5.0, 5)]


def test_a_capture_without_gpu_work_is_refused_in_one_line(trace):
    trace.load({"nvtx_ranges": [push_pop(1, "step", 0, 10, payload=0)]})
    for view in ("gpu_time", "gpu_idle_parts", "gpu_time_summary"):
        with pytest.raises(UserError, match=r"^no GPU work in this capture \(gpu_ops is empty"):
            trace.query(view)


# Random captures: one process, two threads (A launches), up to two GPUs, step ranges on thread A.
@st.composite
def captures(draw):
    tables: dict[str, list[dict]] = {"nvtx_ranges": [], "cuda_api": [], "gpu_ops": [], "nvtx_gpu_projection": []}
    t, n, range_id = 0, 0, 0
    for _ in range(draw(st.integers(1, 5))):  # steps on thread A, each launching 1-3 operations
        start = t + draw(st.integers(0, 20))
        range_id += 1
        step_id, ops = range_id, []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            api_start = start + draw(st.integers(0, 5))
            gpu_start = api_start + draw(st.integers(1, 30))
            gpu_end = gpu_start + draw(st.integers(1, 30))
            tables["cuda_api"].append(call(n, api_start, api_start + draw(st.integers(1, 4)), draw(
                st.sampled_from([LAUNCH, COPY, "cudaMemcpy_v3020"]))))
            tables["gpu_ops"].append(op(n, gpu_start, gpu_end, device=draw(st.integers(0, 1)),
                                        stream=draw(st.integers(1, 2))))
            ops.append((gpu_start, gpu_end))
        end = max(c["end_ns"] for c in tables["cuda_api"][-len(ops):]) + draw(st.integers(0, 10))
        tables["nvtx_ranges"].append(push_pop(step_id, "step", start, end, domain=None))
        tables["nvtx_gpu_projection"].append(projection(step_id, min(s for s, _ in ops), max(e for _, e in ops),
                                                        len(ops)))
        cuts = sorted(draw(st.lists(st.integers(start, end), min_size=4, max_size=4)))  # phases side by side
        for name, (a, b) in zip(("schedule", "sample"), (cuts[:2], cuts[2:])):
            if draw(st.booleans()):
                range_id += 1
                tables["nvtx_ranges"].append(push_pop(range_id, name, a, b, parent=step_id, depth=1, domain=None))
        t = end
    for _ in range(draw(st.integers(0, 3))):  # leaves on thread B, and a sync call on A between steps
        a = draw(st.integers(0, t + 20))
        b = a + draw(st.integers(1, 30))
        range_id += 1
        tables["nvtx_ranges"].append(push_pop(range_id, "tokenize", a, b, tid=TID_B, domain=None))
    for _ in range(draw(st.integers(0, 2))):
        n += 1
        a = draw(st.integers(0, t + 20))
        tables["cuda_api"].append(call(n, a, a + draw(st.integers(1, 40)), SYNC))
    # nested ranges on B are left out: leaves of one name on one thread must not overlap
    b_ranges = sorted((r["start_ns"], r["end_ns"]) for r in tables["nvtx_ranges"] if r["global_tid"] == TID_B)
    kept, until = [], None
    for a, b in b_ranges:
        if until is None or a >= until:
            kept.append((a, b))
            until = b
    tables["nvtx_ranges"] = [r for r in tables["nvtx_ranges"] if r["global_tid"] != TID_B or
                             (r["start_ns"], r["end_ns"]) in kept]
    return recorded(tables) if draw(st.booleans()) else tables  # a profiler span, or the GPU work's


def windows(tables: dict[str, list[dict]]) -> dict[int, tuple[int, int]]:
    """Per device, the window gpu_time must take: the profiler's span widened to the device's work, else its
    work's first start to last end; never a host call's."""
    out = {}
    for device in {o["device_id"] for o in tables["gpu_ops"]}:
        ops = [(o["start_ns"], o["end_ns"]) for o in tables["gpu_ops"] if o["device_id"] == device]
        lo, hi = min(a for a, _ in ops), max(b for _, b in ops)
        for span in tables.get("capture_spans", []):
            lo, hi = min(lo, span["start_ns"]), max(hi, span["end_ns"])
        out[device] = (lo, hi)
    return out


def expected(tables: dict[str, list[dict]]) -> dict[int, tuple[int, Counter, Counter]]:
    """Per device, the reference accounting of this process (rows built by `captures`)."""
    ranges, calls, ops = tables["nvtx_ranges"], tables["cuda_api"], tables["gpu_ops"]
    steps = {p["range_id"]: (p["gpu_start_ns"], p["gpu_end_ns"]) for p in tables["nvtx_gpu_projection"]}
    order = sorted((r["start_ns"], r["range_id"]) for r in ranges if r["text"] == "step")
    iterations = [(*steps[range_id], i) for i, (_, range_id) in enumerate(order)]
    launches = Counter(c["global_tid"] for c in calls if any(o["correlation_id"] == c["correlation_id"] for o in ops))
    host = [HostInterval(tid, a, b, NVTX, launches[tid], "nvtx", name)
            for tid, a, b, name in leaves([(r["global_tid"], r["start_ns"], r["end_ns"], r["text"])
                                           for r in sorted(ranges, key=lambda r: r["range_id"])])
            if b > a]
    host += [HostInterval(tid, a, b, CUDA, launches[tid], api_class(name), name)
             for tid, a, b, name in clipped_calls([(c["global_tid"], c["start_ns"], c["end_ns"], c["name"], c["api_id"])
                                                   for c in calls if launches[c["global_tid"]]])]
    return {device: accounting(window, [(o["start_ns"], o["end_ns"]) for o in ops if o["device_id"] == device],
                               iterations, host)
            for device, window in windows(tables).items()}


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(captures())
def test_random_captures_agree_with_the_plain_python_accounting(trace, tables):
    trace.load(tables)
    reference = expected(tables)
    rows = trace.query("gpu_time", GENERIC)
    assert {r[0]: (r[7], r[9], r[10], r[11]) for r in rows} == {
        device: (busy, kinds["within"], kinds["between"], kinds["outside"])
        for device, (busy, kinds, _) in reference.items()}
    assert all(r[5] == r[7] + r[8] == r[7] + r[9] + r[10] + r[11] for r in rows)  # parts add up to the window
    assert {r[0]: (r[3], r[4], r[14]) for r in rows} == {
        device: (*window, SPAN if "capture_spans" in tables else "GPU work") for device, window in windows(tables).items()}
    parts = Counter()
    for device, _, _, _, kind, _, cause_kind, cause, _, dur_ns, _ in trace.query("gpu_idle_parts", GENERIC):
        parts[device, kind, cause_kind, cause] += dur_ns
    assert +parts == Counter({(device, *key): ns for device, (_, _, causes) in reference.items()
                              for key, ns in causes.items()})
    # One definition of idle: with its steps on one thread and its work on one device, a process's host gaps
    # are exactly that device's idle time between iterations. (A second device has a window of its own,
    # which a gap may lie outside of.)
    if len(rows) == 1:
        assert sum(g[5] for g in trace.query("host_gaps", GENERIC)) == rows[0][10]


# Seventy threads of one process, each with a leaf range and a launch call that overlap the next thread's;
# thread 69 launches twice, so it ranks first among both the leaves and the calls, then 0, 1, ..., 68.
def thread(i: int) -> int:
    return TID_A - 100 + 1000 + i


MANY_THREADS = recorded(merge(
    {"nvtx_ranges": [push_pop(i + 1, "tokenize", 10 * i + 100, 10 * i + 120, tid=thread(i), domain=None)
                     for i in range(70)]},
    *(launch(i + 1, (10 * i + 1000, 10 * i + 1015), (2000, 2010), tid=thread(i)) for i in range(70)),
    launch(71, (795, 796), (2000, 2010), tid=thread(69))))


def test_seventy_threads_all_take_part_in_rank_order(trace):
    trace.load(MANY_THREADS)
    span = (0, PID_100, 100, 2000, "outside", None)
    launched = {0: 15, 68: 5, 69: 15} | {i: 10 for i in range(1, 68)}  # thread 69 beats 68 where they overlap
    leaves = {0: 20, 69: 20} | {i: 10 for i in range(1, 68)}  # 68's leaf lies under 67's and 69's
    assert trace.query("gpu_idle_parts", GENERIC) == (
        [(*span, "cuda_launch", LAUNCH, thread(i), launched[i], None) for i in range(70)]
        + [(*span, "nvtx", "tokenize", thread(i), leaves[i], None) for i in sorted(leaves)]
        + [(*span, "unattributed", "unattributed", None, 190 + 295, None)])  # [810, 1000) and [1705, 2000)
    assert trace.query("host_activity", GENERIC)[:3] == [(PID_100, 100, 110, thread(0), "nvtx", "tokenize", None),
                                                          (PID_100, 110, 120, thread(0), "nvtx", "tokenize", None),
                                                          (PID_100, 120, 130, thread(1), "nvtx", "tokenize", None)]


# Random captures with many threads of one process: each has a few leaf ranges side by side and a few calls
# (some launching work on one of two GPUs), placed so that threads overlap one another often. Every
# thread's leaves and calls have names of their own, so the causes tell which thread won.
def letters(i: int) -> str:
    """i in letters, one for each digit (the generic preset writes digits in a phase name as #)."""
    return "".join(chr(ord("a") + int(d)) for d in str(i))


@st.composite
def many_threads(draw):
    tables: dict[str, list[dict]] = {"nvtx_ranges": [], "cuda_api": [], "gpu_ops": [], "nvtx_gpu_projection": []}
    range_id, n = 0, 0
    for i in range(draw(st.integers(1, 70))):
        t = draw(st.integers(0, 40))
        for _ in range(draw(st.integers(0, 2))):
            t += draw(st.integers(0, 5))
            range_id += 1
            end = t + draw(st.integers(1, 15))
            tables["nvtx_ranges"].append(push_pop(range_id, "phase_" + letters(i), t, end, tid=thread(i), domain=None))
            t = end
        t = draw(st.integers(0, 40))
        for _ in range(draw(st.integers(0, 2))):
            n += 1
            start, end = t + draw(st.integers(0, 5)), t + draw(st.integers(6, 20))
            name = draw(st.sampled_from([LAUNCH, SYNC]))
            tables["cuda_api"].append(call(n, start, end, f"{name}_t{i}", tid=thread(i)))
            if draw(st.booleans()):
                gpu_start = draw(st.integers(0, 60))
                tables["gpu_ops"].append(op(n, gpu_start, gpu_start + draw(st.integers(1, 10)),
                                            device=draw(st.integers(0, 1))))
            t = end
    if not tables["gpu_ops"]:
        n += 1
        tables["cuda_api"].append(call(n, 0, 1, tid=thread(0)))
        tables["gpu_ops"].append(op(n, 70, 75))
    return recorded(tables) if draw(st.booleans()) else tables


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(many_threads())
def test_random_captures_with_many_threads_agree_with_the_plain_python_accounting(trace, tables):
    trace.load(tables)
    reference = expected(tables)
    parts = Counter()
    for device, _, _, _, kind, _, cause_kind, cause, _, dur_ns, _ in trace.query("gpu_idle_parts", GENERIC):
        parts[device, kind, cause_kind, cause] += dur_ns
    assert +parts == Counter({(device, *key): ns for device, (_, _, causes) in reference.items()
                              for key, ns in causes.items()})


# A torch profiler trace with stack frames, as vLLM writes it: thread A is in GPUModelRunner.execute_model
# throughout; inside it _prepare_inputs (a copy in torch inside that) launches a kernel, and sample_tokens
# follows. No NVTX phase covers the idle time: each part is the innermost frame (CUDA calls still win over
# it), with the engine-level frame above it (an engine's frame phases, presets.toml).
RUNNER = "vllm/v1/worker/gpu_model_runner.py"
FRAMES = recorded(merge(
    {"nvtx_ranges": [frame(1, f"{RUNNER}(3380): execute_model", 0, 100),
                     frame(2, f"{RUNNER}(1518): _prepare_inputs", 10, 40, parent=1, depth=1),
                     frame(3, "torch/_tensor.py(99): copy_", 15, 25, parent=2, depth=2),
                     frame(4, f"{RUNNER}(4139): sample_tokens", 50, 90, parent=1, depth=1)]},
    launch(1, (38, 39), (40, 50))))


def test_idle_time_names_the_python_frame_and_the_engine_frame_above_it(trace):
    trace.load(FRAMES)
    execute, prepare, copy, sample = (f"{RUNNER}(3380): execute_model", f"{RUNNER}(1518): _prepare_inputs",
                                      "torch/_tensor.py(99): copy_", f"{RUNNER}(4139): sample_tokens")
    assert trace.query("gpu_time_idle", GENERIC) == [(0, PID_100, 0, 40, 40, "outside", None),
                                                     (0, PID_100, 50, 100, 50, "outside", None)]
    assert trace.query("gpu_idle_parts", GENERIC) == [
        (0, PID_100, 0, 40, "outside", None, "cuda_launch", LAUNCH, TID_A, 1, prepare),
        (0, PID_100, 0, 40, "outside", None, "python", copy, TID_A, 10, prepare),
        (0, PID_100, 0, 40, "outside", None, "python", prepare, TID_A, 19, prepare),
        (0, PID_100, 0, 40, "outside", None, "python", execute, TID_A, 10, None),
        (0, PID_100, 0, 40, "outside", None, "unattributed", "unattributed", None, 0, None),
        (0, PID_100, 50, 100, "outside", None, "python", execute, TID_A, 10, None),
        (0, PID_100, 50, 100, "outside", None, "python", sample, TID_A, 40, sample),
        (0, PID_100, 50, 100, "outside", None, "unattributed", "unattributed", None, 0, None)]


def test_the_window_is_the_profilers_span_or_the_gpu_works_never_a_stray_call(trace):
    """A cudaEventQuery 980 ns after the last kernel (a trace once ran on 90 ms past the profiler's own span)
    is no time of the GPU's: without a profiler span the window is the work's first start to last end; with
    one, the trace span (before the ProfilerStep span), widened to hold every kernel."""
    stray = merge(launch(1, (0, 1), (10, 20)), launch(2, (2, 3), (30, 40)),
                  {"cuda_api": [call(3, 1000, 1001, "cudaEventQuery_v3020")]})
    trace.load(stray)
    assert [(r[3], r[4], r[7], r[14]) for r in trace.query("gpu_time", GENERIC)] == [(10, 40, 20, "GPU work")]
    spans = [{"global_pid": PID_100, "start_ns": 0, "end_ns": 2000, "source": "kineto profiler steps"},
             {"global_pid": PID_100, "start_ns": 15, "end_ns": 500, "source": SPAN}]
    trace.load({**stray, "capture_spans": spans})
    assert [(r[3], r[4], r[7], r[14]) for r in trace.query("gpu_time", GENERIC)] == [(10, 500, 20, SPAN)]
    assert [(r[2], r[3], r[11]) for r in trace.query("gpu_time_summary", GENERIC)] == [(490, 20 / 490, SPAN)]
    trace.load({**stray, "capture_spans": spans[:1]})
    assert [(r[3], r[4], r[14]) for r in trace.query("gpu_time", GENERIC)] == [(0, 2000, "kineto profiler steps")]


# Thread B, which launches nothing, runs an NVTX leaf over two engine frames (input preparation, then sampling);
# thread A's CUDA call under it ends at 50, after the frames changed at 30. A part's engine frame is read at
# the latest start or end of a piece, so the call's end cuts the leaf's time: [0, 50) in preparation, [50,
# 100) in sampling, though B itself has no piece that starts or ends at 50.
FRAME_CUT = recorded(merge(
    {"nvtx_ranges": [push_pop(1, "prepare", 0, 100, tid=TID_B, domain=None),
                     frame(2, f"{RUNNER}(3380): execute_model", 0, 100, tid=TID_B),
                     frame(3, f"{RUNNER}(1518): _prepare_inputs", 0, 30, tid=TID_B, parent=2, depth=1),
                     frame(4, f"{RUNNER}(4139): sample_tokens", 30, 100, tid=TID_B, parent=2, depth=1)]},
    launch(1, (10, 50), (200, 210))))


def test_a_piece_ending_under_a_leaf_cuts_where_its_engine_frame_is_read(trace):
    trace.load(FRAME_CUT)
    prepare, sample = f"{RUNNER}(1518): _prepare_inputs", f"{RUNNER}(4139): sample_tokens"
    assert trace.query("gpu_idle_parts", GENERIC) == [
        (0, PID_100, 0, 200, "outside", None, "nvtx", "prepare", TID_B, 50, prepare),
        (0, PID_100, 0, 200, "outside", None, "nvtx", "prepare", TID_B, 50, sample),
        (0, PID_100, 0, 200, "outside", None, "unattributed", "unattributed", None, 100, None)]
