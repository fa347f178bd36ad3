"""Diff tests of queries/scheduler_overhead.sql: host time outside device work against device time, per iteration."""
from __future__ import annotations

import pytest
from query_fixtures import TID_A, TID_C, projection, push_pop, step


def forward(range_id: int, start_ns: int, end_ns: int, parent: int, *, tid: int = TID_A) -> dict:
    return push_pop(range_id, "forward", start_ns, end_ns, parent=parent, depth=1, tid=tid)


RUN = {
    "nvtx_ranges": [
        step(1, 0, 0, 100),  # device 20..90: host work outside it 30 < 70
        step(2, 0, 0, 100, tid=TID_C),  # device 25..75: host 50 = device 50, not more
        forward(3, 20, 90, 1),
        forward(4, 25, 75, 2, tid=TID_C),
        step(5, 1, 100, 200),  # device 170..190: host 80 > 20
        forward(6, 170, 190, 5),
        step(7, 2, 200, 300),  # GPU work 250..400 runs past the step: host 50 < 150
        step(8, 3, 300, 400),  # GPU work 420..430 after the step: no overlap, host 100 > 10
        step(9, 4, 400, 500),  # no device interval: left out
        step(10, 5, 500, None),  # still open: left out
        forward(11, 510, 520, 10),
    ],
    "nvtx_gpu_projection": [projection(7, 250, 400, 1), projection(8, 420, 430, 1)],
}


@pytest.mark.parametrize("view", ["scheduler_overhead", "scheduler_overhead_summary"])
def test_no_iterations_no_rows(trace, view):
    assert trace.load().query(view) == []


def test_host_exceeds_device_both_ways(trace):
    trace.load(RUN)
    # (global_tid, iteration, host_dur_ns, device_dur_ns, host_only_ns, host_exceeds_device)
    assert trace.query("scheduler_overhead") == [
        (TID_A, 0, 100, 70, 30, False),
        (TID_A, 1, 100, 20, 80, True),
        (TID_A, 2, 100, 150, 50, False),
        (TID_A, 3, 100, 10, 100, True),
        (TID_C, 0, 100, 50, 50, False),
    ]


def test_summary_per_track(trace):
    trace.load(RUN)
    # (global_tid, iterations, host_only_ns, device_ns, host_share, host_exceeds_device,
    #  host_exceeds_device_share, host_only_p50_ns, device_p50_ns); medians are nearest-rank.
    assert trace.query("scheduler_overhead_summary") == [
        (TID_A, 4, 260, 250, 260 / 510, 2, 0.5, 50, 20),
        (TID_C, 1, 50, 50, 0.5, 0, 0.0, 50, 50),
    ]
