"""A prompt's thrash in a full KV pool, run at once: the chain of cycles after a chunk preempted itself.

The scheduler plans and commits the chain (scheduling/thrash.py); here its iterations get their times from
the runner's cost arithmetic on arrays (BulkRunner.step_times), their tokens (BulkRunner.decode_tokens, the
rows sampling in every one), and their rows, events, token times and tallies: what a pass of the loop each
gives. The rows are the iteration rows that started the chain (the stretch's first and the preemption's),
each iteration's times, KV counts and resumption put in. Besides where the scheduler ends it, a chain ends
before the first iteration that starts at or after an arrival, or has a scripted cancel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from itertrace.profiler.intake import Intake
from itertrace.profiler.scheduling import thrash
from itertrace.profiler.scheduling.decision import Event
from itertrace.profiler.scheduling.request import Request
from itertrace.profiler.tracing.records import RunRecord, RunResult

if TYPE_CHECKING:
    from itertrace.profiler.engine import Engine

MAX_STEPS = 256  # iterations a chain looks ahead at most (a longer chain goes on from its next preemption)


def run_chain(engine: Engine, iteration: int, result: RunResult, intake: Intake, resume_row: dict | None,
              preempt_row: dict | None) -> int:
    """Run the chain from `iteration` on (the request that preempted itself in the iteration before is queued);
    `resume_row` and `preempt_row`: the rows of an iteration that resumed it and of its preemption (None: no
    run log). Returns how many iterations ran."""
    sched, runner, record = engine.scheduler, engine.runner, engine.record
    steps = thrash.steps_ahead(sched, MAX_STEPS)
    next_cancel = intake.next_cancel(iteration - 1)
    if next_cancel is not None:
        steps = min(steps, next_cancel - iteration)
    if steps <= 0:
        return 0
    batch = thrash.rows_batch(sched, iteration)
    tokens = runner.decode_tokens(batch, steps)
    kinds, cached = thrash.plan(sched, thrash.first_stop(sched, tokens))
    if not kinds:
        return 0
    req, n = sched._thrash
    rows, kind = len(batch.request_ids), np.array(kinds)
    preempts = kind == thrash.PREEMPT  # the rows alone run; else the rows and the chunk, at `cached`
    seqs, tokens_run = rows + 1 - preempts.astype(np.int64), np.where(preempts, rows, rows + n)
    context = int(batch.start_pos.sum()) + rows * np.arange(len(kinds), dtype=np.int64) + tokens_run
    context += np.where(preempts, 0, np.array(cached, dtype=np.int64))
    host_ns, device_ns = runner.step_times(seqs, tokens_run, context)
    start = engine.clock.now_ns()
    dur = host_ns + device_ns
    ends = start + np.cumsum(dur)
    starts = ends - dur
    next_arrival_ns = intake.next_arrival_ns()
    steps = len(kinds)
    if next_arrival_ns is not None:  # an arrival joins the first iteration that starts at or after it
        steps = int(starts.searchsorted(next_arrival_ns))
        if steps <= 0:
            return 0
    kinds = kinds[:steps]
    allocated, freed, in_use, events = thrash.commit_chain(sched, req, n, kinds, tokens[:steps], iteration)
    engine.clock.advance(int(ends[steps - 1]) - start)
    ids = batch.sampled_ids
    numbers = list(range(iteration, iteration + steps))
    _log(record, resume_row, preempt_row, ids, numbers, kinds, starts[:steps].tolist(), ends[:steps].tolist(),
         host_ns, device_ns[:steps].tolist(), allocated, freed, in_use, events)
    record.set_last_token(ids, int(ends[steps - 1]))
    if record.keep_tokens:
        for rid in ids.tolist():
            record.times[rid].token_ns.extend(ends[:steps].tolist())
            record.times[rid].token_iterations.extend(numbers)
    _tally(engine, result, req, kinds)
    result.iterations_in_bulk += steps
    result.iterations_chained += steps
    return steps


def _log(record: RunRecord, resume_row: dict | None, preempt_row: dict | None, ids: np.ndarray, numbers: list[int],
         kinds: list[int], starts: list[int], ends: list[int], host_ns: int, device_ns: list[int],
         allocated: list[int], freed: list[int], in_use: list[int], events: list[list[Event]]) -> None:
    """Each iteration's events (at its start), its rows' tokens (at its end) and its row."""
    log = record.log
    if log is None:
        return
    no_first = np.zeros(len(ids), dtype=bool)
    for it, kind, start, end, forward, alloc, gone, used, evs in zip(numbers, kinds, starts, ends, device_ns,
                                                                     allocated, freed, in_use, events):
        for ev in evs:
            log.event(ev.request_id, ev.iteration, start, ev.kind.value,
                      ev.reason.value if ev.reason is not None else None, ev.tokens)
        log.token_events(ids, it, end, no_first)
        row = preempt_row if kind == thrash.PREEMPT else resume_row
        log.iteration(row | {
            "iteration": it, "start_ns": start, "end_ns": end, "dur_ns": end - start, "prepare_ns": host_ns,
            "forward_ns": forward, "device_start_ns": start + host_ns, "device_end_ns": end,
            "kv_allocated": alloc, "kv_freed": gone, "kv_in_use": used, "admitted": 0,
            "resumed": int(kind == thrash.RESUME)})


def _tally(engine: Engine, result: RunResult, req: Request, kinds: list[int]) -> None:
    """RunRecord.tally for each iteration: idle slots, those while requests queued, and membership if kept."""
    sched = engine.scheduler
    seqs, rows, queued = sched.config.max_num_seqs, len(sched._rows), len(sched.waiting) - (req in sched.waiting)
    preempting = kinds.count(thrash.PREEMPT)
    running = len(kinds) - preempting
    result.idle_slot_iterations += running * (seqs - rows - 1) + preempting * (seqs - rows)
    result.idle_while_queued += (running * (seqs - rows - 1) if queued else 0) + preempting * (seqs - rows)
    if engine.record.keep_membership:
        alone = [i for i in sched._running_ids if i != req.request_id]
        members = (alone + [req.request_id], alone)
        result.membership.extend(members[kind == thrash.PREEMPT] for kind in kinds)
