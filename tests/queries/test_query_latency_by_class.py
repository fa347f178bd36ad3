"""Diff tests of queries/latency_by_class.sql: power-of-two prompt buckets, priorities, tenants, percentiles."""
from __future__ import annotations

import pytest


def request(request_id: int, prompt_tokens: int, priority: int, tenant: str, arrival_ns: int,
            first_scheduled: int | None) -> dict:
    return {"request_id": request_id, "prompt_tokens": prompt_tokens, "priority": priority, "tenant": tenant,
            "arrival_ns": arrival_ns, "first_scheduled_iteration": first_scheduled}


def tokens(request_id: int, *iterations: int) -> list[dict]:
    """Token events in `iterations`, each at its iteration's end (100 ns per iteration from 0)."""
    return [{"request_id": request_id, "iteration": it, "ts_ns": 100 * (it + 1),
             "kind": "first_token" if i == 0 else "token"} for i, it in enumerate(iterations)]


# Four iterations of 100 ns from 0; requests of every prompt bucket edge, priority and tenant.
RUN = {
    "run_iterations": [{"iteration": k, "start_ns": 100 * k, "end_ns": 100 * (k + 1)} for k in range(4)],
    "run_requests": [
        request(1, 1, 0, "a", 0, 0),
        request(2, 2, 1, "b", 0, 0),
        request(3, 3, 0, "a", 50, 1),
        request(4, 1023, 1, "b", 0, 1),
        request(5, 1024, 2, "a", 100, 2),
        request(6, 0, 0, "c", 0, 0),
        request(7, 5, 0, "c", 0, None),  # never got a token: in no class
    ],
    "run_events": tokens(1, 0, 1) + tokens(2, 0) + tokens(3, 1, 2, 3) + tokens(4, 2) + tokens(5, 2, 3) + tokens(6, 0),
}


@pytest.mark.parametrize("view", ["latency_by_class_requests", "latency_by_class"])
def test_no_requests_no_classes(trace, view):
    assert trace.load().query(view) == []


def test_prompt_buckets_are_powers_of_two_with_their_edges(trace):
    prompts = [0, 1, 2, 3, 4, 1023, 1024, 1025, 2**40 - 1, 2**40]
    trace.load({
        "run_iterations": [{"iteration": 0, "start_ns": 0, "end_ns": 100}],
        "run_requests": [request(i, p, 0, "a", 0, 0) for i, p in enumerate(prompts)],
        "run_events": [event for i in range(len(prompts)) for event in tokens(i, 0)],
    })
    assert trace.sql("SELECT prompt_tokens, prompt_bucket, prompt_bucket_lo FROM latency_by_class_requests") == [
        (0, "0", 0),
        (1, "[1, 2)", 1),
        (2, "[2, 4)", 2),
        (3, "[2, 4)", 2),
        (4, "[4, 8)", 4),
        (1023, "[512, 1024)", 512),
        (1024, "[1024, 2048)", 1024),
        (1025, "[1024, 2048)", 1024),
        (2**40 - 1, f"[{2**39}, {2**40})", 2**39),
        (2**40, f"[{2**40}, {2**41})", 2**40),
    ]


def test_requests_with_their_classes_and_latencies(trace):
    trace.load(RUN)
    # (request_id, prompt_tokens, prompt_bucket, prompt_bucket_lo, priority, tenant, output_tokens,
    #  ttft_ns, tpot_ns, queue_ns)
    assert trace.query("latency_by_class_requests") == [
        (1, 1, "[1, 2)", 1, 0, "a", 2, 100, 100.0, 0),
        (2, 2, "[2, 4)", 2, 1, "b", 1, 100, None, 0),
        (3, 3, "[2, 4)", 2, 0, "a", 3, 150, 100.0, 50),
        (4, 1023, "[512, 1024)", 512, 1, "b", 1, 300, None, 100),
        (5, 1024, "[1024, 2048)", 1024, 2, "a", 2, 200, 100.0, 100),
        (6, 0, "0", 0, 0, "c", 1, 100, None, 0),
    ]


def test_percentiles_per_bucket_priority_and_tenant(trace):
    trace.load(RUN)
    # (class_kind, class, class_order, requests, ttft p50, p90, p99, max, tpot p50, p90, p99, max); the
    # percentiles are nearest-rank, TPOT over requests with two tokens or more.
    none = (None, None, None, None)
    hundred = (100.0, 100.0, 100.0, 100.0)
    assert trace.query("latency_by_class") == [
        ("priority", "0", 0, 3, 100, 150, 150, 150, *hundred),
        ("priority", "1", 1, 2, 100, 300, 300, 300, *none),
        ("priority", "2", 2, 1, 200, 200, 200, 200, *hundred),
        ("prompt_bucket", "0", 0, 1, 100, 100, 100, 100, *none),
        ("prompt_bucket", "[1, 2)", 1, 1, 100, 100, 100, 100, *hundred),
        ("prompt_bucket", "[1024, 2048)", 1024, 1, 200, 200, 200, 200, *hundred),
        ("prompt_bucket", "[2, 4)", 2, 2, 100, 150, 150, 150, *hundred),
        ("prompt_bucket", "[512, 1024)", 512, 1, 300, 300, 300, 300, *none),
        ("tenant", "a", 0, 3, 150, 200, 200, 200, *hundred),
        ("tenant", "b", 0, 2, 100, 300, 300, 300, *none),
        ("tenant", "c", 0, 1, 100, 100, 100, 100, *none),
    ]
