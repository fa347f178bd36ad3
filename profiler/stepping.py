"""How the engine loop runs an iteration it has scheduled: the `Stepping` it is given, and the plainest one.

The loop (Engine.steps) owns intake, cancels, waits, iterations that run nothing and no-progress; a
stepping owns what happens between an iteration's schedule phase and its row in the run log. Three
exist: `OneByOne` (here), `InBulk` (bulk.py) and `Overlapped` (overlap.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from itertrace.profiler.scheduling.decision import Decision
from itertrace.profiler.intake import Intake
from itertrace.profiler.tracing.nvtx_ranges import StepTimes
from itertrace.profiler.tracing.records import RunResult

if TYPE_CHECKING:
    from itertrace.profiler.engine import Engine


class Stepping(Protocol):
    """How the loop runs a scheduled iteration."""

    in_flight: bool  # an iteration is still on the device: the run is not over

    def open_step(self, iteration: int) -> tuple[StepTimes, object]:
        """Read the clock and open the iteration's `step` range: its times, and the range."""

    def close_step(self, step: object) -> None:
        """Close a `step` range that open_step opened."""

    def scheduled(self, decision: Decision) -> None:
        """In the schedule phase, right after the scheduler chose `decision`."""

    def run(self, decision: Decision, times: StepTimes, step: object, queued: int, preempted: int,
            result: RunResult, intake: Intake) -> int:
        """Run `decision` (it has work), and what follows it as one, its own way; returns how many iterations
        ran (0: none; the loop runs `decision` one by one)."""

    def settle(self, result: RunResult, current: StepTimes | None) -> bool:
        """Finish the iteration in flight, if any (`current`: the one being scheduled, whose start stamps its
        events; None: none); whether there was one."""


class OneByOne:
    """Each iteration's phases one after the other (Engine.iteration, which the loop calls itself so that its
    frame lies right inside the iteration's push/pop `step` range)."""

    in_flight = False

    def __init__(self, engine: Engine) -> None:
        self.tracer = engine.tracer

    def open_step(self, iteration: int) -> tuple[StepTimes, object]:
        return self.tracer.start_step(iteration), None

    def close_step(self, step: object) -> None:
        self.tracer.end_step()

    def scheduled(self, decision: Decision) -> None:
        pass

    def run(self, decision: Decision, times: StepTimes, step: object, queued: int, preempted: int,
            result: RunResult, intake: Intake) -> int:
        return 0

    def settle(self, result: RunResult, current: StepTimes | None) -> bool:
        return False
