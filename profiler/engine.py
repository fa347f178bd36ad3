"""The engine loop: schedule, prepare, forward, sample, detokenize, postprocess; each an NVTX range.

`Engine.steps` is the driver: it takes arrivals and scripted cancels in at each iteration boundary,
waits when there is nothing to run, and hands each scheduled iteration to `iteration` (its phases, one
after the other) or, where nothing but the decode rows runs for a while, to `_run_in_bulk` (a stretch
of such iterations at once, with the same logs). `overlap.py` holds the loop that schedules one
iteration ahead.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Iterable

import numpy as np

from itertrace.profiler.batch import BulkRunner, OverlapRunner, Runner
from itertrace.profiler.gcquiet import no_full_collections
from itertrace.profiler.intake import Intake, NoProgress
from itertrace.profiler.nvtx_ranges import FINISH, PhaseName, StepTimes, Tracer, nvtx_recorded
from itertrace.profiler.overlap import overlap_steps
from itertrace.profiler.records import RequestTimes, RunRecord, RunResult
from itertrace.profiler.request import Request
from itertrace.profiler.runlog import RunLog
from itertrace.profiler.scheduler import Decision, Scheduler

__all__ = ["Engine", "NoProgress", "RequestTimes", "RunResult"]


class Engine:
    """Runs a workload to completion through a scheduler and a runner, logging every iteration.

    `bulk`: iterations that only run the decode rows go at once where the runner can (see
    `_run_in_bulk`; a BulkRunner); `overlap`: the host schedules and prepares each iteration while the device runs
    the one before (see overlap.py).
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
        self.overlap = overlap
        # iterations run in bulk only where the runner can, nobody watches each iteration, no tool
        # records NVTX (each iteration keeps its step range under nsys), and one loop runs at a time
        self._bulk = (bulk and isinstance(runner, BulkRunner) and on_iteration is None and not nvtx_recorded()
                      and not overlap)

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
        if self.overlap:
            return (yield from overlap_steps(self, requests))
        intake = Intake(requests)
        sched, clock = self.scheduler, self.clock
        result = self.record.begin(intake.requests, clock.now_ns())
        iteration, idle_runs = 0, 0
        while intake.more or sched.has_work():
            yield
            self.take_in(intake, iteration)
            if not sched.has_work():
                self.wait_for_arrival(intake)
                continue
            times = self.tracer.start_step(iteration)
            with self.tracer.phase(PhaseName.SCHEDULE, times):
                decision = sched.schedule(iteration)
                self.record.mark_admissions()
            queued, preempted = len(sched.waiting), sched.waiting.num_preempted
            if not decision.work:  # nothing runnable: an iteration with no forward pass, logged as such
                self.idle_swaps(decision, times)
                self.record.no_tokens(iteration)
                self.tracer.end_step()
                self.log_idle(decision, times, queued, preempted)
                iteration += 1
                idle_runs += 1
                if intake.more:
                    self.wait_for_arrival(intake)
                elif idle_runs > 1:
                    raise NoProgress(f"iteration {iteration}: {len(sched.waiting)} waiting, "
                                     f"{len(sched.running)} running, nothing schedulable ({decision.limit.value})")
                continue
            idle_runs = 0
            ran = self._run_in_bulk(decision, times, queued, preempted, result, intake) if self._bulk else 0
            if ran:
                self.tracer.end_step()
            else:
                times = self.iteration(decision, times)
                self.tracer.end_step()
                end, phases_ns = times.back_to_back()
                self.finish_iteration(decision, times.start_ns, end, phases_ns, times.device_span(), queued,
                                      preempted, result)
                ran = 1
            iteration += ran
            if self.progress is not None:
                self.report_progress(iteration, ran, intake.taken)
        return self.record.end(result, iteration, clock.now_ns())

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

    def idle_swaps(self, decision: Decision, times: StepTimes) -> None:
        """The swaps of an iteration that runs nothing (all that was runnable yielded its blocks): they are made
        all the same, in its prepare phase, so that a swapped-out request's blocks are in the swap pool when it
        is swapped back in."""
        if decision.swap.swap_out or decision.swap.swap_in:
            with self.tracer.phase(PhaseName.PREPARE, times):
                self.runner.swap(decision.swap)

    def log_idle(self, decision: Decision, times: StepTimes, queued: int, preempted: int) -> None:
        """The row of an iteration with no forward pass: its schedule phase alone."""
        end, phases_ns = times.back_to_back()
        self.record.flush_events(times.start_ns, end)
        log = self.record.log
        if log is not None:
            log.iteration(self.record.iteration_row(decision, times.start_ns, end, phases_ns, queued, preempted,
                                                         None))

    def finish_iteration(self, decision: Decision, start: int, end: int, phases_ns: tuple[int, ...],
                         device: tuple[int, int], queued: int, preempted: int, result: RunResult) -> None:
        """Stamp the iteration's events, count it, tell on_iteration, write its row."""
        self.record.flush_events(start, end)
        self.record.tally(result, decision, queued, 1)
        if self.on_iteration is not None:
            self.on_iteration(decision, start, end)
        log = self.record.log  # (the log property, read once)
        if log is not None:
            log.iteration(self.record.iteration_row(decision, start, end, phases_ns, queued, preempted, device))

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

    def _run_in_bulk(self, d: Decision, times: StepTimes, queued: int, preempted: int, result: RunResult,
                     intake: Intake) -> int:
        """Run this iteration (`d`, just scheduled) and the ones after it at once, where they can run in bulk.

        Such iterations (Scheduler.bulk_rows) run only the decode rows and differ only in positions,
        tokens, times and KV blocks, so the runner gives their times and tokens as arrays, the scheduler
        commits them in one go and their log rows go out as columns: the same rows, events and request
        state as a pass of the loop each (tests/test_bulk.py compares the two). It stops short of the
        iteration where a row finishes or may stop, a request arrives or is canceled, or the KV pool
        runs short: that one runs as usual. Returns how many iterations it ran (0: none; then this one
        runs as usual).
        """
        sched, iteration, start = self.scheduler, d.iteration, times.start_ns
        rows = sched.bulk_rows(d)
        if rows is None:
            return 0
        steps = rows.steps_to_finish()
        next_cancel = intake.next_cancel(iteration)
        if next_cancel is not None:
            steps = min(steps, next_cancel - iteration)
        if steps <= 0:
            return 0
        batch = d.batch
        host_ns, device_ns = self.runner.decode_times(batch, steps)
        dur = host_ns + device_ns
        ends = start + np.cumsum(dur)
        starts = ends - dur
        next_arrival_ns = intake.next_arrival_ns()
        if next_arrival_ns is not None:  # an arrival joins the first iteration that starts at or after it
            steps = min(steps, int(starts.searchsorted(next_arrival_ns)))
        tokens = self.runner.decode_tokens(batch, steps)
        steps = rows.first_stop(tokens)
        block_steps, block_rows = rows.blocks_ahead(steps)  # this iteration's blocks are taken already
        free = sched.blocks.device.num_free
        if len(block_rows) > free:  # the first iteration the pool cannot serve runs as usual (it preempts)
            steps = int(block_steps[free])
        if steps <= 0:
            return 0
        taken = int(block_steps.searchsorted(steps))
        block_steps, block_rows = block_steps[:taken], block_rows[:taken]
        tokens, dur, device_ns, starts, ends = tokens[:steps], dur[:steps], device_ns[:steps], starts[:steps], ends[:steps]
        allocated = np.bincount(block_steps, minlength=steps)
        in_use = sched.blocks.device.num_used + np.cumsum(allocated)
        allocated[0] = sched.blocks.allocated_this_iteration
        row = None
        log = self.record.log
        if log is not None:  # before commit_bulk moves the rows on: this iteration's row, as a template
            row = self.record.iteration_row(d, start, start, (0,) * 6, queued, preempted, None)
        sched.commit_bulk(rows, tokens, block_steps, block_rows)
        self.clock.advance(int(ends[-1]) - start)

        ids, numbers = batch.request_ids, np.arange(iteration, iteration + steps, dtype=np.int64)
        self.record.mark_tokens(iteration, np.sort(ids))
        self.record.tokens_in_bulk(ids, numbers, ends)
        self.record.tally(result, d, queued, steps)
        if row is not None:
            log.iterations(row | {  # the rest as in this iteration's row (kv_freed: 0 in such a stretch)
                "iteration": numbers, "start_ns": starts, "end_ns": ends, "dur_ns": dur, "prepare_ns": host_ns,
                "forward_ns": device_ns, "device_start_ns": starts + host_ns, "device_end_ns": ends, "kv_allocated": allocated, "kv_in_use": in_use}, steps)
        result.iterations_in_bulk += steps
        return steps
