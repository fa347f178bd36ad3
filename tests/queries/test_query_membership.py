"""Diff tests of queries/membership.sql: who held each slot doing what, and static batching's stranded slot-time."""
from __future__ import annotations

import pytest


def iteration(k: int, dur_ns: int, members: list[int], scheduled: list[int], finished: list[int], *, stalled: int = 0,
              prefill: int = 0, decode: int = 0, waiting: int = 0, limit: str = "static_batch") -> dict:
    """A run_iterations row of a batch with 4 slots."""
    return {"iteration": k, "dur_ns": dur_ns, "member_ids": members, "scheduled_ids": scheduled,
            "finished_member_ids": finished, "num_seqs": len(scheduled), "seq_budget": 4,
            "slots_finished": len(finished), "slots_stalled": stalled, "slots_empty": 4 - len(members),
            "prefill_tokens": prefill, "decode_tokens": decode, "num_waiting": waiting, "num_preempted": 0,
            "limit": limit}


# Static batching, 4 slots. Requests 1-3 form a batch; request 3's prefill waits one iteration for
# the token budget; request 1 finishes after iteration 1 and request 2 after iteration 2, both
# keeping their slots until request 3 finishes after iteration 3. Request 4 waits until then.
# Iteration 5 finds nothing to run.
STATIC = {
    "run_meta": [{"mode": "static", "policy": "fcfs", "simulated": False}],
    "run_iterations": [
        iteration(0, 100, [1, 2, 3], [1, 2], [], stalled=1, prefill=20, waiting=1, limit="token_budget"),
        iteration(1, 50, [1, 2, 3], [1, 2, 3], [], prefill=10, decode=2, waiting=1),
        iteration(2, 40, [1, 2, 3], [2, 3], [1], decode=2, waiting=1),
        iteration(3, 30, [1, 2, 3], [3], [1, 2], decode=1, waiting=1),
        iteration(4, 60, [4], [4], [], prefill=10, limit="queue_empty"),
        iteration(5, 5, [], [], [], limit="queue_empty"),
    ],
}


@pytest.mark.parametrize("view", ["membership", "membership_iterations", "membership_stranded"])
def test_no_iterations_no_rows(trace, view):
    assert trace.load().query(view) == []


def test_no_iterations_zero_slot_time(trace):
    assert trace.load().query("membership_slot_time") == [
        (None, None, None, 0, 0, 0, 0, 0, 0, 0, None, 0, 0, 0)]


def test_each_member_working_finished_or_stalled(trace):
    trace.load(STATIC)
    # (iteration, request_id, position, state)
    assert trace.query("membership") == [
        (0, 1, 0, "working"), (0, 2, 1, "working"), (0, 3, 2, "stalled"),
        (1, 1, 0, "working"), (1, 2, 1, "working"), (1, 3, 2, "working"),
        (2, 1, 0, "finished"), (2, 2, 1, "working"), (2, 3, 2, "working"),
        (3, 1, 0, "finished"), (3, 2, 1, "finished"), (3, 3, 2, "working"),
        (4, 4, 0, "working"),
    ]


def test_slots_per_iteration(trace):
    trace.load(STATIC)
    # (iteration, dur_ns, capacity, working, finished, stalled, empty, prefill_tokens, decode_tokens,
    #  active_tokens, waiting, limit_reason, ran)
    assert trace.query("membership_iterations") == [
        (0, 100, 4, 2, 0, 1, 1, 20, 0, 20, 1, "token_budget", True),
        (1, 50, 4, 3, 0, 0, 1, 10, 2, 12, 1, "static_batch", True),
        (2, 40, 4, 2, 1, 0, 1, 0, 2, 2, 1, "static_batch", True),
        (3, 30, 4, 1, 2, 0, 1, 0, 1, 1, 1, "static_batch", True),
        (4, 60, 4, 1, 0, 0, 3, 10, 0, 10, 0, "queue_empty", True),
        (5, 5, 4, 0, 0, 0, 4, 0, 0, 0, 0, "queue_empty", False),
    ]


def test_slot_time_totals_leave_out_iterations_that_ran_nothing(trace):
    trace.load(STATIC)
    # (mode, policy, simulated, iterations, slot_iterations, working, finished, stalled, empty, idle,
    #  idle_share, idle_while_waiting, active_tokens, dur_ns)
    assert trace.query("membership_slot_time") == [
        ("static", "fcfs", False, 5, 20, 9, 3, 1, 7, 11, 11 / 20, 8, 45, 280)]


def test_waiting_counts_preempted_requests_too(trace):
    # Continuous batching: iteration 0 has 1 waiting and 2 preempted, iteration 1 only 1 preempted.
    rows = [iteration(0, 10, [1], [1], [], waiting=1, limit="kv_blocks"),
            iteration(1, 10, [1, 2], [1, 2], [], limit="kv_blocks")]
    rows[0]["num_preempted"], rows[1]["num_preempted"] = 2, 1
    trace.load({"run_meta": [{"mode": "continuous", "policy": "fcfs", "simulated": True}], "run_iterations": rows})
    assert [(row[0], row[10]) for row in trace.query("membership_iterations")] == [(0, 3), (1, 1)]
    # idle_while_waiting: 3 idle slots in iteration 0 and 2 in iteration 1, both with someone waiting.
    assert trace.query("membership_slot_time") == [
        ("continuous", "fcfs", True, 2, 8, 3, 0, 0, 5, 5, 5 / 8, 5, 0, 20)]


def test_stranded_finished_members(trace):
    trace.load(STATIC)
    # (request_id, first_iteration, iterations, stranded_ns)
    assert trace.query("membership_stranded") == [(1, 2, 2, 70), (2, 3, 1, 30)]
