"""Iterations in bulk: a stretch of iterations that repeat the one just scheduled, run at once.

Such iterations (Scheduler.bulk_steps) run the decode rows and at most one prompt chunk of the same size
(scheduling/stretch.py), and differ only in positions, tokens, times and KV blocks, so the runner (a
BulkRunner) gives their times and tokens as arrays, the scheduler commits them in one go
(Scheduler.commit_bulk) and their log rows go out together: the same rows, events and request state as
a pass of the loop each (tests/profiler/test_bulk.py compares the two). A stretch stops short of the
iteration where a row finishes or may stop, the chunk reaches its request's end, a request arrives or is
canceled, or the KV pool runs short: that one runs one by one, unless it is the chunk's request preempting
itself (Scheduler.preempts_chunk), the thrash of a full pool: then it runs right after the stretch
(`InBulk.preempting`), and the cycles of that thrash after it (resume, chunks, preempt again) as a chain
(profiler/thrash.py), while the decode rows stay the same.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from itertrace.profiler.scheduling.decision import Decision
from itertrace.profiler.intake import Intake
from itertrace.profiler.tracing.nvtx_ranges import StepTimes
from itertrace.profiler.tracing.records import RunResult
from itertrace.profiler.stepping import OneByOne
from itertrace.profiler.thrash import run_chain

if TYPE_CHECKING:
    from itertrace.profiler.engine import Engine


class InBulk(OneByOne):
    """One by one, but for stretches of iterations that can run in bulk, which run at once."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.engine = engine

    def run(self, d: Decision, times: StepTimes, step: object, queued: int, preempted: int, result: RunResult,
            intake: Intake) -> int:
        """Run `d` (just scheduled) and the iterations after it at once, where they can run in bulk; returns how
        many ran (0: none; then `d` runs one by one)."""
        engine = self.engine
        sched, runner, record = engine.scheduler, engine.runner, engine.record
        iteration, start = d.iteration, times.start_ns
        steps = sched.bulk_steps(d)
        next_cancel = intake.next_cancel(iteration)
        if next_cancel is not None:
            steps = min(steps, next_cancel - iteration)
        if steps <= 0:
            return 0
        batch = d.batch
        host_ns, device_ns = runner.decode_times(batch, steps)
        dur = host_ns + device_ns
        ends = start + np.cumsum(dur)
        starts = ends - dur
        next_arrival_ns = intake.next_arrival_ns()
        if next_arrival_ns is not None:  # an arrival joins the first iteration that starts at or after it
            steps = min(steps, int(starts.searchsorted(next_arrival_ns)))
        tokens = runner.decode_tokens(batch, steps)
        kv = sched.commit_bulk(tokens)
        if kv is None:
            return 0
        allocated, in_use = kv
        steps = len(allocated)
        dur, device_ns, starts, ends = dur[:steps], device_ns[:steps], starts[:steps], ends[:steps]
        engine.clock.advance(int(ends[-1]) - start)

        ids, numbers = batch.sampled_ids, np.arange(iteration, iteration + steps, dtype=np.int64)
        record.mark_tokens(iteration, np.sort(ids))
        record.flush_events(start, int(ends[0]))  # the first iteration's prompt chunk, if any
        chunk = (d.work[-1][0].request_id, d.prefill_tokens, starts) if d.prefill_tokens else None
        record.tokens_in_bulk(ids, numbers, ends, chunk)
        record.tally(result, d, queued, steps)
        log, row = record.log, None
        if log is not None:  # the rest as in this iteration's row (kv_freed: 0 in such a stretch)
            row = record.iteration_row(d, start, start, (0,) * 6, queued, preempted, None)
            log.iterations(row | {
                "iteration": numbers, "start_ns": starts, "end_ns": ends, "dur_ns": dur, "prepare_ns": host_ns,
                "forward_ns": device_ns, "device_start_ns": starts + host_ns, "device_end_ns": ends,
                "kv_allocated": allocated, "kv_in_use": in_use, **_first_only(d, steps)}, steps)
        result.iterations_in_bulk += steps
        self.tracer.end_step()
        if not sched.preempts_chunk():
            return steps
        # every row's token in it is among `tokens`: the stretch stopped short; then the thrash goes on
        preempt_row = self.preempting(iteration + steps, int(ends[-1]), tokens[steps], result)
        steps += 1
        return steps + run_chain(engine, iteration + steps, result, intake, row, preempt_row)

    def preempting(self, iteration: int, start: int, tokens: np.ndarray, result: RunResult) -> dict | None:
        """Run `iteration`, which starts at `start` right after a stretch that stopped where the pool ran short,
        and in which the stretch's chunk preempts itself (Scheduler.preempt_chunk; `tokens`: [D] the rows'),
        as a pass of the loop would. Returns its row (None: no run log)."""
        engine = self.engine
        sched, runner, record = engine.scheduler, engine.runner, engine.record
        d = sched.preempt_chunk(iteration, tokens)
        queued, preempted = len(sched.waiting), sched.waiting.num_preempted
        host_ns, device_ns = runner.decode_times(d.batch, 1)
        forward_ns = int(device_ns[0])
        end = start + host_ns + forward_ns
        engine.clock.advance(end - start)
        record.flush_events(start, end)  # the preemption's
        record.tokens_in_bulk(d.batch.sampled_ids, np.array([iteration]), np.array([end]))
        record.tally(result, d, queued, 1)
        row = None
        if record.log is not None:
            row = record.iteration_row(d, start, end, (0, host_ns, forward_ns, 0, 0, 0), queued, preempted,
                                       (start + host_ns, end))
            record.log.iteration(row)
        result.iterations_in_bulk += 1
        return row


def _first_only(d: Decision, steps: int) -> dict[str, np.ndarray]:
    """The columns of `d`'s row that hold for the first of `steps` iterations only: the chunk's request was
    admitted or resumed in it (see scheduling/stretch.py)."""
    counts = {"admitted": d.admitted, "resumed": d.resumed}
    return {name: np.array([count] + [0] * (steps - 1), dtype=np.int64) for name, count in counts.items() if count}
