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
placeholder for each token to come (batch.Placeholders), and the requests that reach max_tokens in N finished, so no
request is scheduled past its max_tokens. The placeholders in N+1's inputs become
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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from itertrace.profiler.scheduling.decision import Decision
from itertrace.profiler.intake import Intake
from itertrace.profiler.tracing.nvtx_ranges import FINISH, PhaseName, StepTimes
from itertrace.profiler.tracing.records import RunResult

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


class Overlapped:
    """The Stepping of overlap mode: each iteration is launched, and the one before it completed, in the pass
    of the loop that schedules it; its `step` is a start/end range, closed when its tokens are in."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tracer = engine.tracer
        self.ahead: _Launched | None = None  # the iteration on the device

    @property
    def in_flight(self) -> bool:
        return self.ahead is not None

    def open_step(self, iteration: int) -> tuple[StepTimes, object]:
        return self.tracer.open_step(iteration)

    def close_step(self, step: object) -> None:
        self.tracer.close_step(step)

    def scheduled(self, decision: Decision) -> None:
        """Commit the iteration ahead of its tokens, so that the next one can be scheduled while it runs."""
        if decision.work:
            self.engine.scheduler.commit_ahead(decision)

    def run(self, decision: Decision, times: StepTimes, step: object, queued: int, preempted: int,
            result: RunResult, intake: Intake) -> int:
        """Prepare and launch this iteration; sample and complete the one before it."""
        engine, ahead = self.engine, self.ahead
        runner = engine.runner
        with self.tracer.phase(PhaseName.PREPARE, times):
            prepared = runner.prepare(decision.batch)
        on_device = self.tracer.device_forward(decision.iteration, times)
        if ahead is not None and runner.chains(ahead.decision.batch):  # queued behind N: no wait between them
            runner.launch(prepared, decision.swap, None, on_device)
            previous = self._collect(ahead)
        else:
            previous = None if ahead is None else self._collect(ahead)
            runner.launch(prepared, decision.swap, previous, on_device)
        if ahead is not None:
            self._complete(ahead, previous, result, times)
        self.ahead = _Launched(decision, times, step, queued, preempted, engine.record.kv_counts())
        return 1

    def settle(self, result: RunResult, current: StepTimes | None) -> bool:
        ahead = self.ahead
        if ahead is None:
            return False
        self._complete(ahead, self._collect(ahead), result, current)
        self.ahead = None
        return True

    def _collect(self, ahead: _Launched) -> np.ndarray:
        """Wait for the iteration on the device, then sample its tokens (its blocks held until now go back)."""
        engine = self.engine
        logits = engine.runner.collect()
        engine.scheduler.device_done()
        with self.tracer.phase(PhaseName.SAMPLE, ahead.times):
            return engine.runner.sample(ahead.decision.batch, logits)

    def _complete(self, ahead: _Launched, tokens: np.ndarray, result: RunResult, current: StepTimes | None) -> None:
        """Postprocess and detokenize an iteration whose tokens are in; close its step and write its row.

        Postprocess comes first here: it finds which tokens count, and only those are streamed. The events
        of the iteration being scheduled (`current`) are stamped with its start."""
        engine, tracer, decision, times = self.engine, self.tracer, ahead.decision, ahead.times
        record, batch = engine.record, decision.batch
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
        engine.finish_iteration(decision, start, end, times.measured(), times.forward_interval(), ahead.queued,
                                ahead.preempted, result, kv=ahead.kv, dropped=dropped)
