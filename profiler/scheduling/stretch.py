"""Stretches of iterations the scheduler commits at once (iterations in bulk, profiler/bulk.py).

Notes
-----
A stretch repeats the iteration just scheduled: the decode rows, each one position further per
iteration, and at most one running request's prompt chunk of the same size (its request may have
been admitted, or resumed after preemption, in the first iteration). Such a chunk takes all the token
budget the rows leave, so nothing else can start, and stops short of the end of what its request has
to compute, so it samples nothing: a long prompt, or its recompute after preemption, going through
its chunks beside the decodes. The stretch ends before the iteration where a row finishes or may
stop, the chunk reaches its end, or the KV pool runs short (that one runs one by one and preempts).

Blocks come off a FIFO free list and no block is freed within a stretch, so taking the stretch's
blocks in the order its iterations take them (each iteration: the rows' in row order, then the
chunk's) gives every request the blocks it would get one by one.
"""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.batch_builder import DecodeRows
from itertrace.profiler.scheduling.decision import Decision, Event, EventKind, Mode, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.postprocess import commit_decode_steps
from itertrace.profiler.scheduling.request import Phase, Request

Chunk = tuple[Request, int]  # a running request, and the prompt tokens it runs in each iteration


def repeated_chunk(decision: Decision, rows: DecodeRows, events: list[Event | TokenEvents],
                   config: SchedulerConfig) -> Chunk | None:
    """The prompt chunk that a stretch from `decision` repeats beside the rows, when `decision` runs exactly
    the rows and one such chunk (see the Notes), whose request may have started (been admitted, or resumed
    after preemption) in `decision`; else None."""
    if config.mode is not Mode.CONTINUOUS or len(decision.work) != len(rows) + 1:
        return None
    req, n = decision.work[-1]
    started = decision.admitted + decision.resumed  # the chunk's request started in this iteration
    if (req.phase is not Phase.PREFILL or req.swap_slots or len(rows) + n != config.max_num_batched_tokens
            or req.num_computed + n >= req.num_tokens or started > 1 or len(events) != 1 + started):
        return None
    kinds = (EventKind.ADMIT if decision.admitted else EventKind.RESUME,) * started + (EventKind.PREFILL_CHUNK,)
    if any(type(ev) is not Event or ev.kind is not kind or ev.request_id != req.request_id
           for ev, kind in zip(events, kinds)):
        return None
    return req, n


def chunk_steps(chunk: Chunk) -> int:
    """Iterations, the one just scheduled first, whose chunk stays short of its request's end."""
    req, n = chunk
    return -(-(req.num_tokens - req.num_computed) // n) - 1


def _chunk_blocks(chunk: Chunk, steps: int, block_size: int) -> np.ndarray:
    """[steps] the new blocks the chunk's request takes in each iteration, the one just scheduled first (its
    blocks are taken already: 0)."""
    req, n = chunk
    held = np.arange(1, steps + 1, dtype=np.int64)
    held *= n
    held += req.num_computed + block_size - 1
    held //= block_size  # [steps] blocks covering the request's tokens after each iteration
    np.maximum(held, len(req.block_ids), out=held)
    new = np.zeros(steps, dtype=np.int64)
    np.subtract(held[1:], held[:-1], out=new[1:])
    return new


def commit_stretch(rows: DecodeRows, chunk: Chunk | None, blocks: BlockManager,
                   tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, set[Request], bool] | None:
    """Commit at once the leading iterations of `tokens` ([steps, D]: the rows' tokens, the iteration just
    scheduled first) up to the first where a row may stop on a stop token or the pool lacks a block the
    rows or the chunk take. Returns [n] KV blocks allocated and [n] in use in each of the n iterations
    committed, the requests that took blocks, and whether the pool ran short in iteration n (n < steps);
    None when n would be 0."""
    steps = rows.first_stop(tokens)
    if steps <= 0:
        return None
    row_steps, row_of = rows.blocks_ahead(steps)  # the rows' blocks, by iteration, then row
    allocated = np.bincount(row_steps, minlength=steps)
    if chunk:
        allocated += _chunk_blocks(chunk, steps, blocks.block_size)
    short = (allocated.cumsum() > blocks.device.num_free).nonzero()[0]
    if len(short):  # that iteration preempts (see Scheduler.preempts_chunk)
        steps = int(short[0])
        if steps <= 0:
            return None
        allocated = allocated[:steps]
        cut = int(row_steps.searchsorted(steps))
        row_steps, row_of = row_steps[:cut], row_of[:cut]
    in_use = blocks.device.num_used + allocated.cumsum()
    allocated[0] = blocks.allocated_this_iteration
    grew = _take_blocks(rows, chunk, blocks, row_steps, row_of, steps)
    commit_decode_steps(rows, tokens[:steps])
    return allocated, in_use, grew, bool(len(short))


def _take_blocks(rows: DecodeRows, chunk: Chunk | None, blocks: BlockManager, row_steps: np.ndarray,
                 row_of: np.ndarray, steps: int) -> set[Request]:
    """Take the stretch's blocks in the order its iterations take them, the rows' (`row_steps`, `row_of`:
    blocks_ahead) before the chunk's in each, and put the rows' into their tables; the chunk's request ends
    `steps` chunks further. Returns the requests that took blocks."""
    reqs = rows.reqs
    grew = {reqs[i] for i in row_of.tolist()}
    if chunk is None:  # the rows' alone: in one go
        new = blocks.append_blocks([reqs[i] for i in row_of.tolist()])
    else:
        req, n = chunk
        held, new = len(req.block_ids), []
        bounds = row_steps.searchsorted(np.arange(steps + 1)).tolist()  # the rows' blocks of iteration s: [s, s + 1)
        for s in range(1, steps):
            if bounds[s] < bounds[s + 1]:
                new += blocks.append_blocks([reqs[i] for i in row_of[bounds[s]: bounds[s + 1]].tolist()])
            req.num_computed += n  # as it stands when iteration s is scheduled
            blocks.grow(req, n)
        req.num_computed += n
        if len(req.block_ids) > held:
            grew.add(req)
    if len(new):
        rows.grow_ahead(row_steps, row_of, np.array(new, dtype=np.int64))
    return grew
