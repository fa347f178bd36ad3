"""Diff tests of queries/iterations.sql: each step's host interval and device interval (GPU, device range, none)."""
from __future__ import annotations

from query_fixtures import (PID_100, PID_200, TID_A, TID_B, TID_C, api_call, gpu_op, make_db, projection,
                            push_pop, sorted_rows, start_end, phase, step)

from itertrace.queries import QueryDB


# Columns of `iterations`, in order:
# (iteration, global_tid, global_pid, step_range_id, host_start_ns, host_end_ns, host_dur_ns,
#  device_start_ns, device_end_ns, device_dur_ns, device_source, gpu_op_count, first_launch_ns, launch_latency_ns)


def test_no_ranges_no_iterations(trace):
    assert trace.load().query("iterations") == []


def test_one_gpu_iteration(trace):
    trace.load({
        "nvtx_ranges": [
            step(1, 0, 100, 500),
            phase(2, "schedule", 110, 150, 1),
            phase(3, "forward", 150, 400, 1),
        ],
        "cuda_api": [api_call(1, 200, 210, correlation_id=7), api_call(2, 220, 230, correlation_id=8)],
        "gpu_ops": [gpu_op(1, 250, 300, correlation_id=7), gpu_op(2, 310, 450, correlation_id=8)],
        "nvtx_gpu_projection": [projection(1, 250, 450, 2), projection(3, 250, 450, 2)],
    })
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 100, 500, 400, 250, 450, 200, "gpu", 2, 200, 50)]


def test_gpu_work_else_the_forward_range_else_no_device_interval(trace):
    trace.load({
        "nvtx_ranges": [
            step(1, 0, 0, 100),  # GPU work, and a forward range: the GPU work wins
            phase(2, "forward", 10, 90, 1),
            step(3, 1, 100, 200),  # a forward range only
            phase(4, "schedule", 100, 110, 3),
            phase(5, "forward", 120, 180, 3),
            step(6, 2, 200, 300),  # neither: nothing ran
            phase(7, "schedule", 200, 250, 6),
        ],
        "cuda_api": [api_call(1, 20, 25, correlation_id=1)],
        "gpu_ops": [gpu_op(1, 30, 140, correlation_id=1)],
        "nvtx_gpu_projection": [projection(1, 30, 140, 1), projection(2, 30, 140, 1)],
    })
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 100, 100, 30, 140, 110, "gpu", 1, 20, 10),
        (1, TID_A, PID_100, 3, 100, 200, 100, 120, 180, 60, "range", 0, None, None),
        (2, TID_A, PID_100, 6, 200, 300, 100, None, None, None, None, 0, None, None),
    ]


def test_device_interval_spans_every_forward_range_in_the_step(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "forward", 10, 30, 1),
        phase(3, "sample", 30, 40, 1),
        phase(4, "forward", 50, 70, 1),
        push_pop(5, "forward", 60, 65, parent=4, depth=2),  # nested in the second
    ]})
    assert trace.query("iterations") == [(0, TID_A, PID_100, 1, 0, 100, 100, 10, 70, 60, "range", 0, None, None)]


def test_forward_ranges_outside_the_step_or_on_another_thread_or_domain_do_not_count(trace):
    trace.load({"nvtx_ranges": [
        push_pop(1, "forward", 0, 5),  # before any step
        step(2, 0, 10, 100),
        push_pop(3, "forward", 20, 90, tid=TID_B),  # inside the step's time, on another thread
        push_pop(4, "forward", 30, 40, parent=2, depth=1, domain=None),  # the default domain
        start_end(5, "forward", 95, 120),  # starts inside the step, ends after it
        push_pop(6, "forward", 130, 140),  # after the step
    ]})
    assert trace.query("iterations") == [(0, TID_A, PID_100, 2, 10, 100, 90, None, None, None, None, 0, None, None)]


def test_forward_range_sharing_its_steps_start_and_end_is_inside_it(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "forward", 10, 100, 1),  # ends as the step ends
        step(3, 1, 100, 200),
        phase(4, "forward", 100, 150, 3),  # starts as the step starts (and as the step before ends)
    ]})
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 100, 100, 10, 100, 90, "range", 0, None, None),
        (1, TID_A, PID_100, 3, 100, 200, 100, 100, 150, 50, "range", 0, None, None),
    ]


def test_unterminated_step_keeps_its_closed_forward_range(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "forward", 10, 90, 1),
        step(3, 1, 100, None),  # still open when the capture stopped
        phase(4, "forward", 110, 150, 3),
        phase(5, "forward", 160, None, 3),  # also open: it counts for nothing
    ]})
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 100, 100, 10, 90, 80, "range", 0, None, None),
        (1, TID_A, PID_100, 3, 100, None, None, 110, 150, 40, "range", 0, None, None),
    ]


def test_unterminated_forward_range_gives_no_device_interval(trace):
    trace.load({"nvtx_ranges": [step(1, 0, 0, None), phase(2, "forward", 10, None, 1)]})
    assert trace.query("iterations") == [(0, TID_A, PID_100, 1, 0, None, None, None, None, None, None, 0, None, None)]


def test_threads_and_processes_each_have_their_own_steps_and_launches(trace):
    trace.load({
        "nvtx_ranges": [
            step(1, 0, 0, 100, tid=TID_A),
            step(2, 0, 5, 105, tid=TID_C),  # another process, same iteration number
            step(3, 1, 100, 200, tid=TID_A),
            phase(4, "forward", 120, 180, 3, tid=TID_A),
        ],
        "cuda_api": [
            api_call(1, 10, 12, correlation_id=1, tid=TID_A),
            api_call(2, 15, 17, correlation_id=1, tid=TID_C),  # same id, other process: its own work
            api_call(3, 20, 22, correlation_id=2, tid=TID_C),
            api_call(4, 30, 32, correlation_id=1, tid=TID_B),  # thread B has no step
            api_call(5, 8, 9, correlation_id=2, tid=TID_A),  # id 2 is process 200's kernel: launched nothing here
        ],
        "gpu_ops": [
            gpu_op(1, 40, 60, correlation_id=1, pid=PID_100),
            gpu_op(2, 50, 70, correlation_id=2, pid=PID_200),
            gpu_op(3, 65, 80, correlation_id=1, pid=PID_200),
        ],
        "nvtx_gpu_projection": [projection(1, 40, 60, 1), projection(2, 50, 80, 2)],
    })
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 100, 100, 40, 60, 20, "gpu", 1, 10, 30),
        (0, TID_C, PID_200, 2, 5, 105, 100, 50, 80, 30, "gpu", 2, 15, 35),
        (1, TID_A, PID_100, 3, 100, 200, 100, 120, 180, 60, "range", 0, None, None),
    ]


def test_first_launch_is_the_first_call_inside_the_step_that_launched_gpu_work(trace):
    trace.load({
        "nvtx_ranges": [step(1, 0, 100, 200)],
        "cuda_api": [
            api_call(1, 90, 110, correlation_id=1),  # starts before the step
            api_call(2, 120, 121, correlation_id=2),  # launched nothing (a synchronize, say)
            api_call(3, 130, 135, correlation_id=3),
            api_call(4, 195, 205, correlation_id=4),  # ends after the step
        ],
        "gpu_ops": [gpu_op(1, 150, 160, 1), gpu_op(2, 170, 180, 3), gpu_op(3, 210, 220, 4)],
        "nvtx_gpu_projection": [projection(1, 170, 180, 1)],
    })
    assert trace.query("iterations") == [(0, TID_A, PID_100, 1, 100, 200, 100, 170, 180, 10, "gpu", 1, 130, 40)]


def test_a_launch_at_the_steps_very_start_is_its_first_launch(trace):
    trace.load({
        "nvtx_ranges": [step(1, 0, 0, 100), step(2, 1, 100, 200)],
        "cuda_api": [api_call(1, 10, 12, correlation_id=1), api_call(2, 100, 102, correlation_id=2)],
        "gpu_ops": [gpu_op(1, 20, 30, 1), gpu_op(2, 120, 130, 2)],
        "nvtx_gpu_projection": [projection(1, 20, 30, 1), projection(2, 120, 130, 1)],
    })
    assert trace.query("iterations") == [
        (0, TID_A, PID_100, 1, 0, 100, 100, 20, 30, 10, "gpu", 1, 10, 10),
        (1, TID_A, PID_100, 2, 100, 200, 100, 120, 130, 10, "gpu", 1, 100, 20),
    ]


def test_generic_mapping_with_its_own_device_range(trace):
    trace.load({"nvtx_ranges": [
        push_pop(1, "decode_step_3", 0, 100, domain=None),
        push_pop(2, "model_forward", 20, 60, parent=1, depth=1, domain=None),
        push_pop(3, "forward", 60, 80, parent=1, depth=1, domain=None),  # not the device range here
    ]})
    params = {"preset": "generic", "step_pattern": r"^decode_step_(\d+)$", "iteration_from": "text",
              "device_pattern": "^model_forward$"}
    assert trace.query("iterations", params) == [
        (3, TID_A, PID_100, 1, 0, 100, 100, 20, 60, 40, "range", 0, None, None)]


def test_overlapping_start_end_steps_each_get_the_gpu_work_launched_inside_them(trace):
    # Another engine's steps as start/end ranges that overlap (the next starts before the last ends).
    # The call at 70 lies in both: its kernel is in both projections, and it is the later step's first launch.
    trace.load({
        "nvtx_ranges": [start_end(1, "decode_step_0", 0, 100, domain=None),
                        start_end(2, "decode_step_1", 60, 160, domain=None)],
        "cuda_api": [api_call(1, 10, 12, correlation_id=1), api_call(2, 70, 72, correlation_id=2),
                     api_call(3, 110, 112, correlation_id=3)],
        "gpu_ops": [gpu_op(1, 20, 90, 1), gpu_op(2, 95, 97, 2), gpu_op(3, 120, 150, 3)],
        "nvtx_gpu_projection": [projection(1, 20, 97, 2), projection(2, 95, 150, 2)],
    })
    params = {"preset": "generic", "step_pattern": r"^decode_step_(\d+)$", "iteration_from": "text"}
    assert trace.query("iterations", params) == [
        (0, TID_A, PID_100, 1, 0, 100, 100, 20, 97, 77, "gpu", 2, 10, 10),
        (1, TID_A, PID_100, 2, 60, 160, 100, 95, 150, 55, "gpu", 2, 70, 25),
    ]


def test_a_database_file_opened_by_path_gives_the_same_rows(trace, tmp_path):
    tables = {"nvtx_ranges": [step(1, 0, 0, 100), phase(2, "forward", 10, 90, 1)]}
    with QueryDB(make_db(tmp_path / "trace.duckdb", tables)) as db:
        assert sorted_rows(db.query("iterations")) == trace.load(tables).query("iterations") == [
            (0, TID_A, PID_100, 1, 0, 100, 100, 10, 90, 80, "range", 0, None, None)]
