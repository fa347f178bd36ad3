"""Turning scheduled requests into a Batch of arrays, and the steady-decode fast path.

Notes
-----
Most iterations of a busy server are steady decode: the same requests, one token each, nobody
joining or leaving. `SteadyDecode` keeps that batch's arrays between iterations, so the scheduler
produces the next batch with a few vector operations; only the requests that cross into a new KV
block this iteration (about one in `block_size`) cost Python work. Any change of membership drops
back to the general path, which rebuilds the arrays from the requests.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from itertrace.profiler.batch import Batch
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.request import Request


def build_batch(iteration: int, work: list[tuple[Request, int]], block_size: int) -> Batch:
    """The general path: one row per (request, tokens this iteration), in scheduling order."""
    n = len(work)
    ids, start, counts, sample, generated, tokens = [], [], [], [], [], []
    width = 0
    for r, k in work:  # one pass over the requests: this runs for every iteration that changed
        pos, outputs = r.num_computed, len(r.output_ids)
        ids.append(r.request_id)
        start.append(pos)
        counts.append(k)
        sample.append(pos + k == len(r.prompt_ids) + outputs)
        generated.append(outputs)
        if k == 1 and outputs and pos == len(r.prompt_ids) + outputs - 1:
            tokens.append(r.output_ids[-1])  # a decode: its last sampled token
        else:
            tokens.extend(r.token_slice(pos, k))
        width = max(width, len(r.block_ids))
    lengths = np.array([len(r.block_ids) for r, _ in work], dtype=np.int64)
    tables = np.full((n, width), -1, dtype=np.int64)
    tables[np.arange(width) < lengths[:, None]] = list(chain.from_iterable(r.block_ids for r, _ in work))
    return Batch(
        iteration=iteration,
        block_size=block_size,
        request_ids=np.array(ids, dtype=np.int64),
        start_pos=np.array(start, dtype=np.int64),
        num_tokens=np.array(counts, dtype=np.int64),
        token_ids=np.array(tokens, dtype=np.int64),
        sample=np.array(sample, dtype=bool),
        block_tables=tables,
        num_generated=np.array(generated, dtype=np.int64),
        sampling=tuple(r.sampling for r, _ in work),
    )


class SteadyDecode:
    """The arrays of an all-decode batch, advanced in place from one iteration to the next."""

    def __init__(self, batch: Batch, work: list[tuple[Request, int]], member_ids: list[int]) -> None:
        self.work = work  # [(request, 1)] in scheduling order; shared by every decision it makes
        self.member_ids = member_ids
        self.reqs = [r for r, _ in work]
        self.request_ids = batch.request_ids
        self.sampling = batch.sampling
        self.block_size = batch.block_size
        # the batch just run; `advance` turns it into the state for the next iteration
        self.pos = batch.start_pos.copy()
        self.tokens = np.zeros(len(work), dtype=np.int64)
        self.num_generated = batch.num_generated.copy()
        self.tables = batch.block_tables.copy()
        self.n_blocks = (self.tables >= 0).sum(axis=1)

    def next_batch(self, iteration: int, blocks: BlockManager) -> Batch | None:
        """The next decode batch, growing block tables that fill up; None when blocks run short."""
        grow = np.flatnonzero(self.pos >= self.n_blocks * self.block_size)
        if len(grow) > blocks.device.num_free:
            return None  # someone must be preempted: the general path decides who
        if len(grow):
            if int(self.n_blocks[grow].max()) >= self.tables.shape[1]:
                wider = np.full((len(self.reqs), 2 * self.tables.shape[1] + 1), -1, dtype=np.int64)
                wider[:, : self.tables.shape[1]] = self.tables
                self.tables = wider
            for i in grow.tolist():
                req = self.reqs[i]
                blocks.grow(req, 1)
                self.tables[i, self.n_blocks[i]] = req.block_ids[-1]
            self.n_blocks[grow] += 1
        n = len(self.reqs)
        return Batch(
            iteration=iteration,
            block_size=self.block_size,
            request_ids=self.request_ids,
            start_pos=self.pos.copy(),
            num_tokens=np.ones(n, dtype=np.int64),
            token_ids=self.tokens.copy(),
            sample=np.ones(n, dtype=bool),
            block_tables=self.tables.copy(),
            num_generated=self.num_generated.copy(),
            sampling=self.sampling,
        )

    def advance(self, tokens: np.ndarray) -> None:
        """After a steady iteration: each row wrote one position and sampled `tokens` (row order)."""
        self.pos += 1
        self.num_generated += 1
        self.tokens[:] = tokens
