"""The workload as the engine loop takes it in: arrivals in time order, scripted cancels by iteration."""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from itertrace.profiler.scheduling.request import Request


class NoProgress(RuntimeError):
    """The scheduler holds work but can run none of it, and no arrival can change that."""


class Intake:
    """The workload as the loop takes it in: arrivals in time order, scripted cancels by iteration."""

    def __init__(self, requests: Iterable[Request]) -> None:
        self.requests = sorted(requests, key=lambda r: (r.arrival_ns, r.request_id))
        self._arrivals = [r.arrival_ns for r in self.requests]
        self.taken = 0  # requests taken in so far (a prefix of self.requests)
        self._cancels: dict[int, list[int]] = {}
        for req in self.requests:
            if req.cancel_at_iteration is not None:
                self._cancels.setdefault(req.cancel_at_iteration, []).append(req.request_id)
        self._cancel_iterations = sorted(self._cancels)

    @property
    def more(self) -> bool:
        """Requests still to arrive."""
        return self.taken < len(self.requests)

    def due(self, now_ns: int, iteration: int) -> bool:
        """Whether a request has arrived by `now_ns` and is not taken in, or a cancel is scripted at `iteration`."""
        return (self.taken < len(self._arrivals) and self._arrivals[self.taken] <= now_ns) or iteration in self._cancels

    def arrived(self, now_ns: int) -> list[Request]:
        """The requests arrived by `now_ns` and not yet taken in; they count as taken."""
        upto = bisect.bisect_right(self._arrivals, now_ns, lo=self.taken)
        arrived, self.taken = self.requests[self.taken:upto], upto
        return arrived

    def cancels(self, iteration: int) -> list[int]:
        """Ids of the requests scripted to be canceled at this iteration's boundary."""
        return self._cancels.pop(iteration, [])

    def next_arrival_ns(self) -> int | None:
        return self._arrivals[self.taken] if self.more else None

    def next_cancel(self, iteration: int) -> int | None:
        """The first iteration after `iteration` with a scripted cancel."""
        at = bisect.bisect_right(self._cancel_iterations, iteration)
        return self._cancel_iterations[at] if at < len(self._cancel_iterations) else None
