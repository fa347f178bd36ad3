"""Diff tests of queries/request_latency.sql: per-request latency from the run log and from the trace, compared."""
from __future__ import annotations

import pytest
from query_fixtures import TID_A, TID_C, mark, push_pop

# Six iterations. On the run's clock iteration k runs [1000 + 100k, 1100 + 100k); on the capture's
# clock its step range runs 9000 ns later, except that step 4 ends (and step 5 starts) 3 ns late.
# Request 1 gets tokens in iterations 0-2 and finishes; request 2 gets tokens in 0-1, is preempted
# in 2 and gets tokens again in 3-5; request 3 arrives and is never scheduled.
STEPS = [(10000, 10100), (10100, 10200), (10200, 10300), (10300, 10400), (10400, 10503), (10503, 10600)]

LOG = {
    "run_iterations": [{"iteration": k, "start_ns": 1000 + 100 * k, "end_ns": 1100 + 100 * k} for k in range(6)],
    "run_requests": [
        {"request_id": 1, "arrival_ns": 900, "first_scheduled_iteration": 0},
        {"request_id": 2, "arrival_ns": 950, "first_scheduled_iteration": 0},
        {"request_id": 3, "arrival_ns": 1050, "first_scheduled_iteration": None},
    ],
    "run_events": [
        {"request_id": 1, "iteration": 0, "ts_ns": 990, "kind": "arrive"},
        {"request_id": 2, "iteration": 0, "ts_ns": 995, "kind": "arrive"},
        {"request_id": 1, "iteration": 0, "ts_ns": 1000, "kind": "admit"},
        {"request_id": 2, "iteration": 0, "ts_ns": 1000, "kind": "admit"},
        {"request_id": 1, "iteration": 0, "ts_ns": 1100, "kind": "first_token"},
        {"request_id": 2, "iteration": 0, "ts_ns": 1100, "kind": "first_token"},
        {"request_id": 3, "iteration": 1, "ts_ns": 1100, "kind": "arrive"},
        {"request_id": 1, "iteration": 1, "ts_ns": 1200, "kind": "token"},
        {"request_id": 2, "iteration": 1, "ts_ns": 1200, "kind": "token"},
        {"request_id": 2, "iteration": 2, "ts_ns": 1200, "kind": "preempt"},
        {"request_id": 1, "iteration": 2, "ts_ns": 1300, "kind": "token"},
        {"request_id": 1, "iteration": 2, "ts_ns": 1300, "kind": "finish"},
        {"request_id": 2, "iteration": 3, "ts_ns": 1300, "kind": "resume"},
        {"request_id": 2, "iteration": 3, "ts_ns": 1400, "kind": "token"},
        {"request_id": 2, "iteration": 4, "ts_ns": 1500, "kind": "token"},
        {"request_id": 2, "iteration": 5, "ts_ns": 1600, "kind": "token"},
    ],
}

TRACE = {
    "nvtx_ranges": [push_pop(k + 1, "step", start, end, payload=k) for k, (start, end) in enumerate(STEPS)],
    "nvtx_marks": [
        mark(1, "arrive", 9990, 1),
        mark(2, "arrive", 9995, 2),
        mark(3, "admit", 10001, 1),
        mark(4, "admit", 10002, 2),
        mark(5, "tokens +1,2", 10003, 0),
        mark(6, "arrive", 10100, 3),
        mark(7, "tokens -2", 10201, 2),  # request 2 preempted
        mark(8, "tokens +2 -1", 10301, 3),  # request 2 back, request 1 done
        mark(9, "tokens +3", 10302, 3, domain=None),  # another domain: not this engine's
    ],
}


@pytest.mark.parametrize("view", ["request_latency_log_tokens", "request_latency_trace_tokens",
                                  "request_latency_log", "request_latency_trace", "request_latency_compare"])
def test_no_rows_no_latencies(trace, view):
    assert trace.load().query(view) == []


def test_token_times_from_the_log(trace):
    trace.load(LOG)
    # (request_id, token_index, iteration, ts_ns)
    assert trace.query("request_latency_log_tokens") == [
        (1, 0, 0, 1100), (1, 1, 1, 1200), (1, 2, 2, 1300),
        (2, 0, 0, 1100), (2, 1, 1, 1200), (2, 2, 3, 1400), (2, 3, 4, 1500), (2, 4, 5, 1600),
    ]


def test_token_times_from_the_tokens_marks_and_step_ends(trace):
    trace.load(TRACE)
    # Request 2's stretches are [0, 2) and [3, end of the trace); its token times are step ends.
    assert trace.query("request_latency_trace_tokens") == [
        (1, 0, 0, 10100), (1, 1, 1, 10200), (1, 2, 2, 10300),
        (2, 0, 0, 10100), (2, 1, 1, 10200), (2, 2, 3, 10400), (2, 3, 4, 10503), (2, 4, 5, 10600),
    ]


def test_latency_from_the_log(trace):
    trace.load(LOG)
    # (request_id, arrival_ns, intake_ns, first_scheduled_ns, first_token_ns, last_token_ns, output_tokens,
    #  queue_ns, ttft_ns, tpot_ns, itl_ns, itl_max_ns, e2e_ns)
    assert trace.query("request_latency_log") == [
        (1, 900, 990, 1000, 1100, 1300, 3, 100, 200, 100.0, [100, 100], 100, 400),
        (2, 950, 995, 1000, 1100, 1600, 5, 50, 150, 125.0, [100, 200, 100, 100], 200, 650),
        (3, 1050, 1100, None, None, None, 0, None, None, None, [], None, None),
    ]


def test_latency_from_the_trace(trace):
    trace.load(TRACE)
    # (request_id, arrival_ns, first_scheduled_ns, first_token_ns, last_token_ns, output_tokens,
    #  queue_ns, ttft_ns, tpot_ns, itl_ns, itl_max_ns, e2e_ns)
    assert trace.query("request_latency_trace") == [
        (1, 9990, 10000, 10100, 10300, 3, 10, 110, 100.0, [100, 100], 100, 310),
        (2, 9995, 10000, 10100, 10600, 5, 5, 105, 125.0, [100, 200, 103, 97], 200, 605),
        (3, 10100, None, None, None, 0, None, None, None, [], None, None),
    ]


def test_arrive_and_admit_marks_of_other_domains_are_not_this_engines(trace):
    # Marks another library left, with this engine's names: an earlier arrive of request 1, the
    # arrive of a request 9 the engine never saw, and an admit of request 3, which was never scheduled.
    trace.load({**TRACE, "nvtx_marks": TRACE["nvtx_marks"] + [
        mark(10, "arrive", 9980, 1, domain=None),
        mark(11, "arrive", 9000, 9, domain=None),
        mark(12, "admit", 10105, 3, domain="torch"),
    ]})
    assert trace.query("request_latency_trace") == [
        (1, 9990, 10000, 10100, 10300, 3, 10, 110, 100.0, [100, 100], 100, 310),
        (2, 9995, 10000, 10100, 10600, 5, 5, 105, 125.0, [100, 200, 103, 97], 200, 605),
        (3, 10100, None, None, None, 0, None, None, None, [], None, None),
    ]


def test_admit_mark_belongs_to_the_step_on_its_thread_that_holds_it(trace):
    # Request 7's admit mark is at the very start of step 1: that step holds it. Request 8's is in
    # step 1 too, after a step range of another thread started: that one is not its step.
    trace.load({
        "nvtx_ranges": [push_pop(1, "step", 0, 100, payload=0), push_pop(2, "step", 100, 200, payload=1),
                        push_pop(3, "step", 150, 250, payload=0, tid=TID_C)],
        "nvtx_marks": [mark(1, "arrive", 50, 7), mark(2, "arrive", 60, 8),
                       mark(3, "admit", 100, 7, tid=TID_A), mark(4, "admit", 160, 8, tid=TID_A)],
    })
    # (request_id, arrival_ns, first_scheduled_ns, ..., queue_ns, ...)
    assert trace.query("request_latency_trace") == [
        (7, 50, 100, None, None, 0, 50, None, None, [], None, None),
        (8, 60, 100, None, None, 0, 40, None, None, [], None, None),
    ]


def test_one_token_has_no_tpot_and_no_itl(trace):
    trace.load({
        "run_iterations": [{"iteration": 0, "start_ns": 0, "end_ns": 100}],
        "run_requests": [{"request_id": 7, "arrival_ns": 0, "first_scheduled_iteration": 0}],
        "run_events": [{"request_id": 7, "iteration": 0, "ts_ns": 100, "kind": "first_token"}],
        "nvtx_ranges": [push_pop(1, "step", 0, 100, payload=0)],
        "nvtx_marks": [mark(1, "arrive", 0, 7), mark(2, "admit", 1, 7), mark(3, "tokens +7", 2, 0),
                       mark(4, "tokens -7", 101, 1)],
    })
    assert trace.query("request_latency_log") == [(7, 0, None, 0, 100, 100, 1, 0, 100, None, [], None, 100)]
    assert trace.query("request_latency_trace") == [(7, 0, 0, 100, 100, 1, 0, 100, None, [], None, 100)]


def test_compare_measures_both_from_intake(trace):
    trace.load({**LOG, **TRACE})
    # (request_id, intake_delay_ns, output_tokens_log, output_tokens_trace, queue_diff_ns, ttft_log_ns,
    #  ttft_trace_ns, ttft_diff_ns, tpot_log_ns, tpot_trace_ns, tpot_diff_ns, itl_max_diff_ns, e2e_diff_ns,
    #  itl_abs_diff_max_ns): only step 4's late end differs, by 3 ns in two ITLs.
    assert trace.query("request_latency_compare") == [
        (1, 90, 3, 3, 0, 110, 110, 0, 100.0, 100.0, 0.0, 0, 0, 0),
        (2, 45, 5, 5, 0, 105, 105, 0, 125.0, 125.0, 0.0, 0, 0, 3),
        (3, 50, 0, 0, None, None, None, None, None, None, None, None, None, None),
    ]


def test_compare_keeps_requests_only_one_side_has(trace):
    trace.load({
        "run_requests": [{"request_id": 4, "arrival_ns": 800, "first_scheduled_iteration": None}],
        "run_events": [{"request_id": 4, "iteration": 0, "ts_ns": 1000, "kind": "arrive"}],
        "nvtx_marks": [mark(1, "arrive", 500, 5)],
    })
    assert trace.query("request_latency_compare") == [
        (4, 200, 0, None, None, None, None, None, None, None, None, None, None, None),
        (5, None, None, 0, None, None, None, None, None, None, None, None, None, None),
    ]


def test_a_capture_begun_mid_run_ignores_a_removal_with_no_addition_before_it(trace):
    # The capture starts at iteration 2: request 5 was already getting tokens (its + mark is not in the
    # capture), so its first mark is a removal; request 6 is added at 2 and removed at 4; step 5 is
    # still open when the capture stops, so it made no token.
    steps = [push_pop(k + 1, "step", 100 * k, 100 * k + 90, payload=k) for k in range(2, 5)]
    steps.append(push_pop(9, "step", 500, None, payload=5))
    trace.load({
        "nvtx_ranges": steps,
        "nvtx_marks": [mark(1, "tokens +6 -5", 205, 2), mark(2, "tokens -6 +5", 405, 4)],
    })
    assert trace.query("request_latency_trace_tokens") == [
        (5, 0, 4, 490),
        (6, 0, 2, 290), (6, 1, 3, 390),
    ]
