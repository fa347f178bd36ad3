"""Stretches of iterations the scheduler commits at once (iterations in bulk, profiler/bulk.py).

Notes
-----
A stretch repeats the iteration just scheduled: the decode rows, each one position further per
iteration, and at most one running request's prompt chunk of the same size. Such a chunk takes all
the token budget the rows leave, so nothing else can start, and stops short of the end of what its
request has to compute, so it samples nothing: a long prompt, or its recompute after preemption,
going through its chunks beside the decodes. The stretch ends before the iteration where a row
finishes or may stop, the chunk reaches its end, or the KV pool runs short (that one runs one by one).

Blocks come off a FIFO free list and no block is freed within a stretch, so taking all its blocks in
one go, in the order the iterations take them (each iteration: the rows' in row order, then the
chunk's), gives every request the blocks it would get iteration by iteration.
"""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.batch_builder import DecodeRows
from itertrace.profiler.scheduling.decision import Decision, Event, EventKind, Mode, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.postprocess import commit_decode_steps
from itertrace.profiler.scheduling.request import Phase, Request

Chunk = tuple[Request, int]  # a running request, and the prompt tokens it runs in each iteration


def repeated_chunk(decision: Decision, rows: DecodeRows, events: list[Event | TokenEvents], config: SchedulerConfig) -> Chunk | None:
    """The prompt chunk that a stretch from `decision` repeats beside the rows, when `decision` runs exactly
    the rows and one such chunk (see the Notes); else None."""
    if config.mode is not Mode.CONTINUOUS or len(decision.work) != len(rows) + 1:
        return None
    req, n = decision.work[-1]
    if (req.phase is not Phase.PREFILL or req.swap_slots or len(rows) + n != config.max_num_batched_tokens
            or req.num_computed + n >= req.num_tokens or len(events) != 1):
        return None
    ev = events[0]
    if type(ev) is not Event or ev.kind is not EventKind.PREFILL_CHUNK or ev.request_id != req.request_id:
        return None
    return req, n


def chunk_steps(chunk: Chunk) -> int:
    """Iterations, the one just scheduled first, whose chunk stays short of its request's end."""
    req, n = chunk
    return -(-(req.num_tokens - req.num_computed) // n) - 1


def _chunk_block_steps(chunk: Chunk, steps: int, block_size: int) -> np.ndarray:
    """The iteration (1 .. steps - 1 after the one just scheduled) in which the chunk's request takes each of
    its new blocks, in order; the first iteration's blocks are taken already."""
    req, n = chunk
    covered = -(-(req.num_computed + n * np.arange(1, steps + 1, dtype=np.int64)) // block_size)
    held = np.maximum(len(req.block_ids), covered)  # [steps] blocks held after each iteration
    return np.repeat(np.arange(1, steps, dtype=np.int64), np.diff(held))


def commit_stretch(rows: DecodeRows, chunk: Chunk | None, blocks: BlockManager,
                   tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Request]] | None:
    """Commit at once the leading iterations of `tokens` ([steps, D]: the rows' tokens, the iteration just
    scheduled first) up to the first where a row may stop on a stop token or the pool lacks a block the
    rows or the chunk take. Returns [n] KV blocks allocated and [n] in use in each of the n iterations
    committed, and the requests that took blocks (in no set order); None when n would be 0."""
    steps = rows.first_stop(tokens)
    row_steps, row_of = rows.blocks_ahead(steps)  # the rows' blocks, by iteration, then row
    chunk_steps_ = _chunk_block_steps(chunk, len(tokens), blocks.block_size) if chunk else row_steps[:0]
    at = np.concatenate((row_steps, chunk_steps_))
    order = np.argsort(at, kind="stable")  # by iteration; in each, the rows' blocks before the chunk's
    at = at[order]
    if len(at) > blocks.device.num_free:
        steps = min(steps, int(at[blocks.device.num_free]))
    if steps <= 0:
        return None
    order = order[: int(at.searchsorted(steps))]
    allocated = np.bincount(at[: len(order)], minlength=steps)
    in_use = blocks.device.num_used + np.cumsum(allocated)
    allocated[0] = blocks.allocated_this_iteration
    owners = [rows.reqs[i] for i in row_of.tolist()] + ([chunk[0]] * len(chunk_steps_) if chunk else [])
    new = np.array(blocks.append_blocks([owners[i] for i in order.tolist()]), dtype=np.int64)
    is_row = order < len(row_steps)
    kept = order[is_row]  # a prefix of the rows' blocks: the same order
    if len(kept):
        rows.grow_ahead(row_steps[kept], row_of[kept], new[is_row])
    grew = [rows.reqs[i] for i in np.unique(row_of[kept]).tolist()]
    if chunk and len(kept) < len(order):
        grew.append(chunk[0])
    commit_decode_steps(rows, tokens[:steps])
    if chunk:
        chunk[0].num_computed += chunk[1] * steps
    return allocated, in_use, grew
