"""The engine loop: schedule, prepare, forward, sample, detokenize, postprocess; each an NVTX range.

`Engine.steps` is the one loop: at each iteration boundary it takes arrivals and scripted cancels in,
waits when there is nothing to run, schedules, logs an iteration that runs nothing and stops a run that
can make no progress. How a scheduled iteration runs is the `Stepping` it is given (stepping.py): one
by one (`iteration`, its phases one after the other), in bulk (bulk.py: a stretch of iterations that
repeat one another, the decode rows and at most one prompt chunk, at once, else one by one), or one
ahead with overlap (overlap.py).
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Iterable

import numpy as np

from itertrace.profiler.scheduling.batch import BulkRunner, OverlapRunner, Runner
from itertrace.profiler.bulk import InBulk
from itertrace.profiler.gcquiet import no_full_collections
from itertrace.profiler.intake import Intake, NoProgress
from itertrace.profiler.tracing.nvtx_ranges import FINISH, PhaseName, StepTimes, Tracer, nvtx_recorded
from itertrace.profiler.overlap import Overlapped
from itertrace.profiler.tracing.records import RequestTimes, RunRecord, RunResult
from itertrace.profiler.scheduling.request import Request
from itertrace.profiler.tracing.runlog import RunLog
from itertrace.profiler.scheduling.scheduler import Decision, Scheduler
from itertrace.profiler.stepping import OneByOne, Stepping

__all__ = ["Engine", "NoProgress", "RequestTimes", "RunResult"]


class Engine:
    """Runs a workload to completion through a scheduler and a runner, logging every iteration.

    `bulk`: iterations that repeat one another (the decode rows, and at most one prompt chunk) go at once
    where the runner can (a BulkRunner; see bulk.py); `overlap`: the host schedules and prepares each
    iteration while the device runs the one before (an OverlapRunner; see overlap.py).
    """

    def __init__(self, scheduler: Scheduler, runner: Runner, clock, *, log: RunLog | None = None,
                 tracer: Tracer | None = None, keep_membership: bool = False, keep_tokens: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 on_iteration: Callable[[Decision, int, int], None] | None = None, bulk: bool = True,
                 overlap: bool = False) -> None:
        self.scheduler = scheduler
        self.runner = runner
        scheduler.read_tokens = runner.reads_tokens
        self.clock = clock
        self.tracer = tracer or Tracer(clock)
        self.record = RunRecord(scheduler, runner, self.tracer, log, keep_membership=keep_membership,
                                keep_tokens=keep_tokens)
        self.progress = progress  # called with (iteration, requests arrived); it decides when to print
        # simulated iterations take microseconds: every thousandth will do; a model's, every one
        self._progress_every = 1000 if runner.simulated else 1
        self.on_iteration = on_iteration  # called with (decision, start_ns, end_ns) after each iteration
        if overlap and not isinstance(runner, OverlapRunner):
            raise ValueError(f"runner {runner.name} cannot launch a forward pass and go on: no overlap mode")
        # iterations run in bulk only where the runner can, nobody watches each iteration, no tool
        # records NVTX (each iteration keeps its step range under nsys), and one loop runs at a time
        bulk = bulk and not overlap and on_iteration is None and not nvtx_recorded() and isinstance(runner, BulkRunner)
        self.stepping: Stepping = Overlapped(self) if overlap else InBulk(self) if bulk else OneByOne(self)

    @property
    def log(self) -> RunLog | None:
        """Where the run's logs go (None: nowhere); the record writes them."""
        return self.record.log

    @log.setter
    def log(self, log: RunLog | None) -> None:
        self.record.log = log

    def run(self, requests: Iterable[Request]) -> RunResult:
        """Run the requests until every one reaches a terminal state."""
        with no_full_collections():
            steps = self.steps(requests)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value

    def steps(self, requests: Iterable[Request]) -> Generator[None, None, RunResult]:
        """The run as a generator: it pauses before each pass of the loop and returns the RunResult.

        `run` drives it to the end; session.run_in_turn drives several at once, a pass each in turn.
        """
        intake = Intake(requests)
        sched, clock, record, stepping = self.scheduler, self.clock, self.record, self.stepping
        result = record.begin(intake.requests, clock.now_ns())
        iteration, idle_runs = 0, 0
        while intake.more or sched.has_work() or stepping.in_flight:
            yield
            self.take_in(intake, iteration)
            if not sched.has_work():
                if not stepping.settle(result, None):
                    self.wait_for_arrival(intake)
                continue
            times, step = stepping.open_step(iteration)
            with self.tracer.phase(PhaseName.SCHEDULE, times):
                decision = sched.schedule(iteration)
                record.mark_admissions()
                stepping.scheduled(decision)
            queued, preempted = len(sched.waiting), sched.waiting.num_preempted
            if not decision.work:  # nothing runnable now: what the device runs may free slots and blocks
                idle_runs = 0 if stepping.settle(result, times) else idle_runs + 1
                self.idle_iteration(decision, times, step, queued, preempted)
                iteration += 1
                if intake.more:
                    self.wait_for_arrival(intake)
                elif idle_runs > 1:
                    raise NoProgress(f"iteration {iteration}: {len(sched.waiting)} waiting, "
                                     f"{len(sched.running)} running, nothing schedulable ({decision.limit.value})")
                continue
            idle_runs = 0
            ran = stepping.run(decision, times, step, queued, preempted, result, intake)
            if not ran:  # one by one: Engine.iteration's frame right inside the step, as profilers show it
                times = self.iteration(decision, times)
                stepping.close_step(step)
                end, phases_ns = times.back_to_back()
                record.flush_events(times.start_ns, end)
                self.finish_iteration(decision, times.start_ns, end, phases_ns, times.device_span(), queued,
                                      preempted, result)
                ran = 1
            iteration += ran
            if self.progress is not None:
                self.report_progress(iteration, ran, intake.taken)
        return record.end(result, iteration, clock.now_ns())

    # ---- around an iteration -------------------------------------------------------------------------
    def take_in(self, intake: Intake, iteration: int) -> None:
        """At an iteration boundary: the requests arrived by now join, the scripted cancels happen."""
        now = self.clock.now_ns()
        if not intake.due(now, iteration):  # most boundaries: nothing to do
            return
        for req in intake.arrived(now):
            self.record.take_in(req, self.clock.now_ns())
            self.scheduler.add(req, iteration)
        for rid in intake.cancels(iteration):
            self.scheduler.cancel(rid, iteration)
        self.record.flush_events(now, now)

    def wait_for_arrival(self, intake: Intake) -> None:
        if intake.more:
            self.clock.sleep_until(intake.next_arrival_ns())

    def idle_iteration(self, decision: Decision, times: StepTimes, step: object, queued: int, preempted: int) -> None:
        """An iteration with no forward pass: its swaps, its step closed, its row (its schedule phase alone).

        All that was runnable yielded its blocks: the swaps are made all the same, in its prepare phase,
        so that a swapped-out request's blocks are in the swap pool when it is swapped back in."""
        if decision.swap.swap_out or decision.swap.swap_in:
            with self.tracer.phase(PhaseName.PREPARE, times):
                self.runner.swap(decision.swap)
        self.record.no_tokens(decision.iteration)
        self.stepping.close_step(step)
        end, phases_ns = times.back_to_back()
        self.record.flush_events(times.start_ns, end)
        log = self.record.log
        if log is not None:
            log.iteration(self.record.iteration_row(decision, times.start_ns, end, phases_ns, queued, preempted,
                                                    None))

    def finish_iteration(self, decision: Decision, start: int, end: int, phases_ns: tuple[int, ...],
                         device: tuple[int, int], queued: int, preempted: int, result: RunResult, **row) -> None:
        """Count an iteration whose events are stamped, tell on_iteration, write its row (`row`: more of
        iteration_row's keywords)."""
        self.record.tally(result, decision, queued, 1)
        if self.on_iteration is not None:
            self.on_iteration(decision, start, end)
        log = self.record.log  # (the log property, read once)
        if log is not None:
            log.iteration(self.record.iteration_row(decision, start, end, phases_ns, queued, preempted, device,
                                                    **row))

    def report_progress(self, iteration: int, ran: int, arrived: int) -> None:
        """Progress at every multiple of _progress_every that the last `ran` iterations passed."""
        every = self._progress_every
        for passed in range((iteration - ran) // every + 1, iteration // every + 1):
            self.progress(passed * every, arrived)

    # ---- one iteration ----------------------------------------------------------------------------------
    def iteration(self, decision: Decision, times: StepTimes) -> StepTimes:
        """The phases after schedule, one after the other: prepare, forward, sample, detokenize, postprocess."""
        tracer, runner, batch = self.tracer, self.runner, decision.batch
        with tracer.phase(PhaseName.PREPARE, times):
            if decision.swap.swap_out or decision.swap.swap_in:
                runner.swap(decision.swap)
            prepared = runner.prepare(batch)
        with tracer.phase(PhaseName.FORWARD, times):
            logits = runner.forward(prepared)
        with tracer.phase(PhaseName.SAMPLE, times):
            tokens = runner.sample(batch, logits)
        with tracer.phase(PhaseName.DETOKENIZE, times):
            if self.record.streams_text:
                self.record.detokenize(batch.sampled_ids, tokens)
        with tracer.phase(PhaseName.POSTPROCESS, times):
            for req in self.scheduler.postprocess(decision, tokens, decision.iteration):
                tracer.mark(FINISH, req.request_id)  # inside its step: it finished this iteration
            self.record.mark_tokens(decision.iteration, np.sort(batch.sampled_ids))
        return times
