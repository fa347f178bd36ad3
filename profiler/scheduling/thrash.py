"""A prompt's thrash in a full KV pool, its cycles committed at once (profiler/thrash.py runs them).

Notes
-----
After a prompt chunk's request preempted itself (Scheduler.preempt_chunk), the iterations that follow
repeat a cycle while the decode rows stay the same: the request resumes with a chunk (R), runs more
chunks of the same size (C) while the blocks of its next one fit beside the rows', and preempts itself
(P), recomputing from the start the next time. Which of R, C or P an iteration is follows from counts
alone: the free blocks, the rows' blocks (taken first in each iteration, `DecodeRows.blocks_ahead`) and
the chunk's. A chain ends before an iteration that would do anything else: the rows lack a block (a row
would preempt), the request cannot start, its chunk would reach its end, or a row finishes or may stop.

The queue's head is the request at every R: the chain starts with it at the head, nothing else joins or
leaves the queue, and its key is the same each time it queues (the policy's key does not age). Blocks come
off the FIFO free list and a yielding request's go to its back, so taking and giving them back through
the pool in iteration order, the rows' before the chunk's, hands every request the blocks of one by one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from itertrace.profiler.scheduling.batch import Batch
from itertrace.profiler.scheduling.decision import Event, EventKind
from itertrace.profiler.scheduling.policies import Policy
from itertrace.profiler.scheduling.postprocess import commit_decode_steps
from itertrace.profiler.scheduling.request import Request

if TYPE_CHECKING:
    from itertrace.profiler.scheduling.scheduler import Scheduler

RESUME, CHUNK, PREEMPT = 0, 1, 2  # what an iteration of a chain does


class Plan(NamedTuple):
    """A chain's iterations: [n] what each does (RESUME, CHUNK, PREEMPT), and [n] the prompt tokens its request
    had cached before it (for the context its attention reads)."""

    kinds: list[int]
    cached: list[int]


def steps_ahead(sched: Scheduler, most: int) -> int:
    """Iterations, at most `most`, before a decode row samples its last token."""
    return min(most, sched._rows.steps_to_finish())


def rows_batch(sched: Scheduler, iteration: int) -> Batch:
    """The decode rows as they run in `iteration`: every iteration of a chain samples them (and them alone)."""
    return sched._rows.batch(iteration)


def first_stop(sched: Scheduler, tokens: np.ndarray) -> int:
    """The first of the rows' coming `tokens` ([steps, D]) where a row may stop on a stop token; steps if none."""
    return sched._rows.first_stop(tokens)


def plan(sched: Scheduler, steps: int) -> Plan:
    """At most `steps` iterations of the cycle of the request that preempted itself in the iteration just run
    (Scheduler.preempt_chunk), from the next one on, while the cycle holds (see the Notes)."""
    (req, n), rows, blocks, cfg = sched._thrash, sched._rows, sched.blocks, sched.config
    kinds: list[int] = []
    cached: list[int] = []
    if (cfg.policy is Policy.PRIORITY or len(rows) >= cfg.max_num_seqs or sched.waiting.peek() is not req
            or req.num_tokens <= n or sched._admission.reserved):
        return Plan(kinds, cached)
    row_steps, _ = rows.blocks_ahead(steps)
    grow = np.bincount(row_steps, minlength=steps).tolist()
    free, held, done, size = blocks.device.num_free, 0, 0, blocks.block_size  # done: the request's tokens cached
    for t in range(steps):
        free -= grow[t]
        if free < 0:  # a row would preempt
            break
        if not done:  # queued: it resumes, if its first chunk's blocks fit
            need = -(-n // size)
            if need > free:
                break
            kinds.append(RESUME)
        elif done + n >= req.num_tokens:  # the chunk would reach the request's end
            break
        else:
            need = -(-(done + n) // size) - held
            kinds.append(CHUNK if need <= free else PREEMPT)
        cached.append(done)
        if kinds[-1] == PREEMPT:
            free, held, done = free + held, 0, 0
        else:
            free, held, done = free - need, held + need, done + n
    return Plan(kinds, cached)


def commit_chain(sched: Scheduler, req: Request, n: int, kinds: list[int], tokens: np.ndarray,
                 iteration: int) -> tuple[list[int], list[int], list[int], list[list[Event]]]:
    """Commit the chain's iterations (`kinds` from `plan`, from `iteration` on; `tokens`: [len(kinds), D] the
    rows'), as schedule and postprocess would one by one. Returns per iteration the blocks allocated, freed
    and in use after it, and its events (the tokens' aside)."""
    rows, blocks = sched._rows, sched.blocks
    pool, admission, events = blocks.device, sched._admission, sched.events
    steps = len(kinds)
    row_steps, row_of = rows.blocks_ahead(steps)
    bounds = row_steps.searchsorted(np.arange(steps + 1)).tolist()
    reqs, new = rows.reqs, []
    allocated, freed, in_use, chain_events = [], [], [], []
    for t, kind in enumerate(kinds):
        it, used = iteration + t, pool.num_used
        if bounds[t] < bounds[t + 1]:
            new += blocks.append_blocks([reqs[i] for i in row_of[bounds[t]: bounds[t + 1]].tolist()])
        gone = 0
        if kind == PREEMPT:
            gone = len(req.block_ids)
            sched._preempt(req, it)
        else:
            if kind == RESUME:
                admission.start(req, sched._swap, it)
                sched._enter(sched.waiting.pop())
            blocks.grow(req, n)
            events.append(Event(req.request_id, it, EventKind.PREFILL_CHUNK, tokens=n))
            req.num_computed += n
        for name in admission.counts:
            admission.counts[name] = 0
        allocated.append(pool.num_used - used + gone)
        freed.append(gone)
        in_use.append(pool.num_used)
        chain_events.append(events.copy())
        events.clear()
    if new:
        rows.grow_ahead(row_steps, row_of, np.array(new, dtype=np.int64))
    commit_decode_steps(rows, tokens)
    sched._rows_run = 0
    return allocated, freed, in_use, chain_events

