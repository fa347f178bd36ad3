"""Diff tests: the trace queries on an overlap-mode trace (steps that overlap in time as start/end ranges, host
phases on the engine's thread, forward passes numbered by iteration on a device thread)."""
from __future__ import annotations

from query_fixtures import (PID_100, TID_A, TID_B, TID_C, api_call, gpu_op, mark, projection, push_pop,
                            start_end)


def _overlap_trace() -> dict[str, list[dict]]:
    """Three iterations, each step open from its schedule to its detokenize; iteration N+1's schedule and prepare
    run while N's forward pass runs on thread B. Request 5 gets tokens in iterations 0 and 1, request 6 (admitted
    in step 1, while step 0 is still open) in 1 and 2."""
    phases = [("schedule", 0, 50), ("prepare", 50, 100), ("schedule", 300, 340), ("prepare", 340, 380),
              ("sample", 420, 450), ("postprocess", 460, 480), ("detokenize", 480, 500),
              ("schedule", 700, 720), ("prepare", 720, 760), ("sample", 800, 830), ("postprocess", 850, 880),
              ("detokenize", 880, 900), ("sample", 1150, 1170), ("postprocess", 1170, 1190),
              ("detokenize", 1190, 1200)]
    ranges = [start_end(1, "step", 0, 500, payload=0), start_end(2, "step", 300, 900, payload=1),
              start_end(3, "step", 700, 1200, payload=2)]
    ranges += [push_pop(10 + i, name, start, end) for i, (name, start, end) in enumerate(phases)]
    ranges += [push_pop(40, "forward", 100, 400, tid=TID_B, payload=0),
               push_pop(41, "forward", 460, 790, tid=TID_B, payload=1),
               push_pop(42, "forward", 840, 1140, tid=TID_B, payload=2),
               push_pop(43, "forward", 1000, 1100, tid=TID_B),  # unnumbered, on a thread with no step: nobody's
               push_pop(44, "forward", 450, 480, tid=TID_C, payload=1)]  # numbered, in another process: nobody's
    marks = [mark(1, "arrive", 0, 5), mark(2, "admit", 10, 5), mark(3, "arrive", 290, 6), mark(4, "admit", 310, 6),
             mark(5, "tokens +5", 470, 0), mark(6, "tokens +6", 860, 1), mark(7, "tokens -5", 1180, 2)]
    return {"nvtx_ranges": ranges, "nvtx_marks": marks}


def test_iterations_take_the_forward_range_of_their_number(trace):
    trace.load(_overlap_trace())
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 500, 500, 100, 400, 300, "range", 0, None, None),
        (1, TID_A, PID_100, 2, 300, 900, 600, 460, 790, 330, "range", 0, None, None),
        (2, TID_A, PID_100, 3, 700, 1200, 500, 840, 1140, 300, "range", 0, None, None)]


def test_gaps_run_between_the_forward_passes_and_split_among_the_engine_threads_phases(trace):
    trace.load(_overlap_trace())
    assert trace.query("host_gaps") == [(TID_A, 0, 1, 400, 460, 60), (TID_A, 1, 2, 790, 840, 50)]
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "sample", 30), (TID_A, 1, "unattributed", 30), (TID_A, 2, "sample", 30),
        (TID_A, 2, "unattributed", 20)]


def test_latency_from_the_marks_and_the_overlapping_steps(trace):
    trace.load(_overlap_trace())
    assert trace.query("request_latency_trace") == [
        (5, 0, 0, 500, 900, 2, 0, 500, 400, [400], 400, 900),
        (6, 290, 300, 900, 1200, 2, 10, 610, 300, [300], 300, 910)]


def test_a_numbered_forward_range_outside_its_step_is_not_its_device_work(trace):
    """Where iterations are numbered by order, payloads say nothing: a forward range then counts only inside a
    step on its own thread."""
    tables = _overlap_trace()
    assert trace.load(tables).query("iterations", {"iteration_from": "order"}) == [
        (0, TID_A, PID_100, 1, 0, 500, 500, None, None, None, None, 0, None, None),
        (1, TID_A, PID_100, 2, 300, 900, 600, None, None, None, None, 0, None, None),
        (2, TID_A, PID_100, 3, 700, 1200, 500, None, None, None, None, 0, None, None)]
    late = [r if r["range_id"] != 41 else {**r, "start_ns": 910, "end_ns": 950} for r in tables["nvtx_ranges"]]
    rows = trace.load({**tables, "nvtx_ranges": late}).query("iterations")
    assert [(r[0], r[7], r[8]) for r in rows] == [(0, 100, 400), (1, None, None), (2, 840, 1140)]


def test_on_cuda_the_device_interval_is_the_work_each_numbered_forward_launched(trace):
    """Overlap mode on CUDA: the forward ranges (push/pop on the engine's thread, numbered) launch the kernels;
    step 0, still open while step 1's forward launches, would project onto both iterations' work."""
    tables = {
        "nvtx_ranges": [start_end(1, "step", 0, 500, payload=0), start_end(2, "step", 300, 900, payload=1),
                        push_pop(3, "forward", 100, 150, payload=0), push_pop(4, "forward", 460, 500, payload=1),
                        push_pop(5, "sample", 440, 455)],
        "cuda_api": [api_call(1, 110, 120, correlation_id=1), api_call(2, 470, 480, correlation_id=2)],
        "gpu_ops": [gpu_op(1, 130, 420, correlation_id=1), gpu_op(2, 490, 800, correlation_id=2)],
        "nvtx_gpu_projection": [projection(1, 130, 800, 2), projection(2, 490, 800, 1), projection(3, 130, 420, 1),
                                projection(4, 490, 800, 1)],
    }
    assert trace.load(tables).query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 500, 500, 130, 420, 290, "gpu", 1, 110, 20),
        (1, TID_A, PID_100, 2, 300, 900, 600, 490, 800, 310, "gpu", 1, 470, 20)]
    assert trace.query("host_gaps") == [(TID_A, 0, 1, 420, 490, 70)]
    assert trace.query("host_gaps_parts") == [  # launching the next forward pass is host work too
        (TID_A, 1, "forward", 30), (TID_A, 1, "sample", 15), (TID_A, 1, "unattributed", 25)]
