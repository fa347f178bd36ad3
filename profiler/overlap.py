"""Overlap mode: the host schedules and prepares iteration N+1 while the device runs N.

Notes
-----
Each pass of the loop takes iteration N+1 while N is on the device:

    intake | schedule N+1 | prepare N+1 | (wait for N) sample N | launch N+1 | detokenize N | postprocess N

so only sample waits for the device; schedule and prepare of N+1, detokenize and postprocess of N run
while it computes. Where the runner can put N's tokens into N+1's inputs on the device side (the
torch runner on the CPU, when N's rows are all greedy: `chains`), N+1 is launched before waiting for N

    intake | schedule N+1 | prepare N+1 | launch N+1 | (wait for N) sample N | detokenize N | postprocess N

and the device goes from N to N+1 without waiting for the host to wake up (on a busy machine a woken
thread may wait milliseconds for a core).

schedule N+1 sees N committed ahead of its tokens (Scheduler.commit_ahead): positions moved on, a
placeholder for each token to come (batch.Placeholders), and the requests that reach max_tokens in N
finished, so no request is scheduled past its max_tokens. The placeholders in N+1's inputs become
N's tokens when N+1 is launched (the runner puts them in). postprocess N puts N's tokens into the
requests (Scheduler.commit_sampled): a request whose token is a stop token finishes in N and the
token N+1 computes for it is dropped, as is the token of a request canceled while N ran; dropped
tokens are never emitted nor counted (RunResult.tokens_dropped, the rows' dropped_tokens). A finish
or a cancel frees no block that an iteration given to the device reads until that iteration is
done (BlockManager.hold); a preemption frees its victim's blocks at once, for the iteration being
scheduled, which the device runs after the one that reads them.

Iteration N's step is a start/end range from its schedule phase to its postprocess phase (they
overlap the next iteration's, see nvtx_ranges), its forward pass a `forward` range numbered N on
the thread that runs the device work. Its row in the run log has each phase's own duration (they
no longer add up to the step's) and the forward pass's interval (device_start_ns, device_end_ns).
Iterations never run in bulk here.
"""
from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from itertrace.profiler.intake import Intake, NoProgress
from itertrace.profiler.nvtx_ranges import FINISH, PhaseName, StepTimes
from itertrace.profiler.records import RunResult
from itertrace.profiler.request import Request
from itertrace.profiler.scheduler import Decision

if TYPE_CHECKING:
    from itertrace.profiler.engine import Engine


@dataclass
class _Launched:
    """An iteration given to the device whose tokens are not in yet."""

    decision: Decision
    times: StepTimes
    step: object  # its NVTX step range
    queued: int  # the queue it left: waiting, and of them preempted
    preempted: int
    kv: tuple[int, int, int] | None = None  # its KV counts (RunRecord.kv_counts), at the end of its own pass


def overlap_steps(engine: Engine, requests: Iterable[Request]) -> Generator[None, None, RunResult]:
    """Engine.steps in overlap mode: a generator that pauses before each pass and returns the RunResult."""
    sched, runner, tracer, record, clock = engine.scheduler, engine.runner, engine.tracer, engine.record, engine.clock
    intake = Intake(requests)
    result = record.begin(intake.requests, clock.now_ns())
    iteration, idle_runs, ahead = 0, 0, None
    while intake.more or sched.has_work() or ahead is not None:
        yield
        engine.take_in(intake, iteration)
        if not sched.has_work():
            if ahead is not None:
                _complete(engine, ahead, _collect(engine, ahead), result, None)
                ahead = None
            else:
                engine.wait_for_arrival(intake)
            continue
        times, step = tracer.open_step(iteration)
        with tracer.phase(PhaseName.SCHEDULE, times):
            decision = sched.schedule(iteration)
            record.mark_admissions()
            if decision.work:
                sched.commit_ahead(decision)
        launched = _Launched(decision, times, step, len(sched.waiting), sched.waiting.num_preempted)
        if not decision.work:  # nothing runnable now: what the device runs may free slots and blocks
            idle_runs = 0 if ahead is not None else idle_runs + 1
            if ahead is not None:
                _complete(engine, ahead, _collect(engine, ahead), result, times)
                ahead = None
            engine.idle_swaps(decision, times)  # the device is done with what they copy
            record.no_tokens(iteration)
            tracer.close_step(step)
            engine.log_idle(decision, times, launched.queued, launched.preempted)
            iteration += 1
            if intake.more:
                engine.wait_for_arrival(intake)
            elif idle_runs > 1:
                raise NoProgress(f"iteration {iteration}: {len(sched.waiting)} waiting, "
                                 f"{len(sched.running)} running, nothing schedulable ({decision.limit.value})")
            continue
        idle_runs = 0
        with tracer.phase(PhaseName.PREPARE, times):
            prepared = runner.prepare(decision.batch)
        on_device = tracer.device_forward(iteration, times)
        if ahead is not None and runner.chains(ahead.decision.batch):  # queued behind N: no wait between them
            runner.launch(prepared, decision.swap, None, on_device)
            previous = _collect(engine, ahead)
        else:
            previous = None if ahead is None else _collect(engine, ahead)
            runner.launch(prepared, decision.swap, previous, on_device)
        if ahead is not None:
            _complete(engine, ahead, previous, result, times)
        launched.kv = record.kv_counts()
        ahead = launched
        iteration += 1
        if engine.progress is not None:
            engine.report_progress(iteration, 1, intake.taken)
    return record.end(result, iteration, clock.now_ns())


def _collect(engine: Engine, ahead: _Launched) -> np.ndarray:
    """Wait for the iteration on the device, then sample its tokens (its blocks held until now go back)."""
    logits = engine.runner.collect()
    engine.scheduler.blocks.release_held()
    with engine.tracer.phase(PhaseName.SAMPLE, ahead.times):
        return engine.runner.sample(ahead.decision.batch, logits)


def _complete(engine: Engine, ahead: _Launched, tokens: np.ndarray, result: RunResult,
              current: StepTimes | None) -> None:
    """Postprocess and detokenize an iteration whose tokens are in; close its step and write its row.

    Postprocess comes first here: it finds which tokens count, and only those are streamed. The events
    of the iteration being scheduled (`current`) are stamped with its start."""
    tracer, record, decision, times = engine.tracer, engine.record, ahead.decision, ahead.times
    batch = decision.batch
    with tracer.phase(PhaseName.POSTPROCESS, times):
        finished, kept = engine.scheduler.commit_sampled(decision, tokens)
        for req in finished:
            tracer.mark(FINISH, req.request_id)  # inside its step
        getting = batch.sampled_ids[kept]
        record.mark_tokens(decision.iteration, np.sort(getting))
    with tracer.phase(PhaseName.DETOKENIZE, times):
        record.detokenize(getting, tokens[kept])
    tracer.close_step(ahead.step)
    dropped = len(kept) - int(kept.sum())
    if dropped:  # their requests had ended: what sampling their tokens made again goes too
        result.tokens_dropped += dropped
        for rid in batch.sampled_ids[~kept].tolist():
            engine.runner.release(rid)
    start, end = times.start_ns, times.last_end()
    now = (current.start_ns,) * 2 if current is not None else (start, end)
    record.flush_events(*now, {decision.iteration: (start, end)})
    record.tally(result, decision, ahead.queued, 1)
    if engine.on_iteration is not None:
        engine.on_iteration(decision, start, end)
    if record.log is not None:
        record.log.iteration(record.iteration_row(decision, start, end, times.measured(), ahead.queued,
                                                  ahead.preempted, times.forward_interval(), kv=ahead.kv,
                                                  dropped=dropped))
