"""Diff tests of queries/fairness.sql: stalls, preemptions and resumptions per request, and one request's progress."""
from __future__ import annotations

import pytest


def tokens(request_id: int, *iterations: int) -> list[dict]:
    """Token events in `iterations`, each at its iteration's end (100 ns per iteration from 0)."""
    return [{"request_id": request_id, "iteration": it, "ts_ns": 100 * (it + 1),
             "kind": "first_token" if i == 0 else "token"} for i, it in enumerate(iterations)]


def moves(request_id: int, kind: str, *iterations: int) -> list[dict]:
    return [{"request_id": request_id, "iteration": it, "ts_ns": 100 * it, "kind": kind} for it in iterations]


def request(request_id: int, arrival_ns: int, output_tokens: int, final_state: str) -> dict:
    return {"request_id": request_id, "arrival_ns": arrival_ns, "output_tokens": output_tokens,
            "final_state": final_state}


# Eight iterations of 100 ns from 0. Request 1 gets a token in every one. Request 2 is preempted
# twice (in 2 and 6) and resumes twice (in 4 and 7). Request 3 gets one token and is preempted for
# good. Request 4 is rejected.
RUN = {
    "run_iterations": [{"iteration": k, "start_ns": 100 * k, "end_ns": 100 * (k + 1), "num_seqs": n}
                       for k, n in enumerate([2, 2, 2, 1, 2, 2, 1, 2])],
    "run_requests": [
        request(1, 0, 8, "finished_length"),
        request(2, 0, 5, "finished_stop"),
        request(3, 150, 1, "canceled"),
        request(4, 700, 0, "rejected"),
    ],
    "run_events": (tokens(1, 0, 1, 2, 3, 4, 5, 6, 7)
                   + tokens(2, 0, 1, 4, 5, 7) + moves(2, "preempt", 2, 6) + moves(2, "resume", 4, 7)
                   + tokens(3, 2) + moves(3, "preempt", 3)
                   + moves(4, "reject", 7)),
}


@pytest.mark.parametrize("view", ["fairness", "fairness_progress"])
def test_no_requests_no_rows(trace, view):
    assert trace.load().query(view) == []


def test_stalls_preemptions_and_resumptions(trace):
    trace.load(RUN)
    # (request_id, output_tokens, longest_stall_ns, longest_stall_iterations, preemptions, resumptions,
    #  repeatedly_preempted, final_state); request 2's longest stall is iterations 2-3, between tokens 1 and 4.
    assert trace.query("fairness") == [
        (1, 8, 100, 0, 0, 0, False, "finished_length"),
        (2, 5, 300, 2, 2, 2, True, "finished_stop"),
        (3, 1, None, None, 1, 0, False, "canceled"),
        (4, 0, None, None, 0, 0, False, "rejected"),
    ]


def test_only_preempt_and_resume_events_count_as_moves(trace):
    # A real log also has each request's arrive, admit and finish events: none is a preemption or a resumption.
    trace.load({**RUN, "run_events": RUN["run_events"] + moves(1, "arrive", 0) + moves(1, "admit", 0)
                + moves(2, "arrive", 0) + moves(2, "admit", 0) + moves(3, "arrive", 2) + moves(3, "admit", 2)
                + moves(1, "finish", 7) + moves(2, "finish", 7) + moves(4, "arrive", 7)})
    assert trace.sql("SELECT request_id, preemptions, resumptions FROM fairness") == [
        (1, 0, 0), (2, 2, 2), (3, 1, 0), (4, 0, 0)]


def test_repeat_threshold_sets_what_counts_as_repeatedly_preempted(trace):
    trace.load(RUN)
    repeated = "SELECT request_id, repeatedly_preempted FROM fairness"
    assert trace.sql(repeated, {"repeat_threshold": "1"}) == [(1, False), (2, True), (3, True), (4, False)]
    assert trace.sql(repeated, {"repeat_threshold": "3"}) == [(1, False), (2, False), (3, False), (4, False)]


def test_progress_follows_the_request_with_most_tokens_by_default(trace):
    trace.load(RUN)
    # (request_id, tokens, iteration, ts_ns, since_arrival_ns, others_working)
    assert trace.query("fairness_progress") == [
        (1, 1, 0, 100, 100, 1), (1, 2, 1, 200, 200, 1), (1, 3, 2, 300, 300, 1), (1, 4, 3, 400, 400, 0),
        (1, 5, 4, 500, 500, 1), (1, 6, 5, 600, 600, 1), (1, 7, 6, 700, 700, 0), (1, 8, 7, 800, 800, 1),
    ]


def test_progress_of_a_chosen_request(trace):
    trace.load(RUN)
    assert trace.query("fairness_progress", {"request_id": "3"}) == [(3, 1, 2, 300, 150, 1)]
    assert trace.query("fairness_progress", {"request_id": "2"}) == [
        (2, 1, 0, 100, 100, 1), (2, 2, 1, 200, 200, 1), (2, 3, 4, 500, 500, 1), (2, 4, 5, 600, 600, 1),
        (2, 5, 7, 800, 800, 1),
    ]


def test_progress_by_default_breaks_ties_by_the_lowest_id(trace):
    trace.load({
        "run_iterations": [{"iteration": 0, "start_ns": 0, "end_ns": 100, "num_seqs": 2}],
        "run_requests": [request(9, 0, 1, "finished_stop"), request(8, 0, 1, "finished_stop")],
        "run_events": tokens(9, 0) + tokens(8, 0),
    })
    assert trace.query("fairness_progress") == [(8, 1, 0, 100, 100, 1)]
