"""Scheduling policies, and the queue that keeps waiting requests in policy order.

Every policy's key is fixed while a request waits (arrival, remaining work, deadline, and priority
aged from the iteration it was queued), so the queue is a heap: admission costs O(log n) however
long the queue grows.
"""
from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable, Iterator
from itertools import count

from itertrace.profiler.scheduling.request import Phase, Request


class Policy(enum.Enum):
    FCFS = "fcfs"  # arrival order
    SRW = "srw"  # shortest remaining work first (prompt left + output tokens left)
    EDF = "edf"  # earliest deadline first; requests without one go last
    PRIORITY = "priority"  # priority class (lower first), aged: one class is worth `aging_iterations` of waiting


SortKey = Callable[[Request], tuple]


def sort_key(policy: Policy, aging_iterations: int) -> SortKey:
    """The key that orders requests under `policy`, most deserving first; ties break by arrival, then id."""
    if policy is Policy.FCFS:
        return lambda r: (r.arrival_ns, r.request_id)
    if policy is Policy.SRW:
        return lambda r: (r.remaining_work, r.arrival_ns, r.request_id)
    if policy is Policy.EDF:
        return lambda r: (r.deadline_ns if r.deadline_ns is not None else math.inf, r.arrival_ns, r.request_id)
    if policy is Policy.PRIORITY:
        # A class-p request queued at iteration q ranks with a class-0 request queued at q + p * aging:
        # after waiting `aging_iterations` it overtakes everything one class more urgent queued since.
        age = max(1, aging_iterations)
        return lambda r: (r.priority * age + r.enqueued_iteration, r.arrival_ns, r.request_id)
    raise ValueError(f"unknown policy {policy}")


class WaitQueue:
    """Waiting and preempted requests in policy order; removal is lazy."""

    def __init__(self, key: SortKey) -> None:
        self._key = key
        self._heap: list[tuple[tuple, int, Request]] = []
        self._seq = count()
        self._live: dict[int, Request] = {}  # request id -> request, for the ones really queued
        self._preempted: set[int] = set()  # ids queued after a preemption

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._live.values())

    def __contains__(self, req: Request) -> bool:
        return req.request_id in self._live

    def find(self, request_id: int) -> Request | None:
        return self._live.get(request_id)

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (self._key(req), next(self._seq), req))
        self._live[req.request_id] = req
        if req.phase is Phase.PREEMPTED:
            self._preempted.add(req.request_id)

    @property
    def num_preempted(self) -> int:
        return len(self._preempted)

    def peek(self) -> Request | None:
        while self._heap and self._heap[0][2].request_id not in self._live:
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Request:
        req = self.peek()
        if req is None:
            raise IndexError("pop from an empty queue")
        heapq.heappop(self._heap)
        self._forget(req)
        return req

    def remove(self, req: Request) -> None:
        if req.request_id in self._live:
            self._forget(req)

    def _forget(self, req: Request) -> None:
        del self._live[req.request_id]
        self._preempted.discard(req.request_id)
