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

import numpy as np

from itertrace.profiler.batch import Batch
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.request import Request


def build_batch(iteration: int, work: list[tuple[Request, int]], block_size: int) -> Batch:
    """The general path: one row per (request, tokens this iteration), in scheduling order."""
    n = len(work)
    width = max((len(r.block_ids) for r, _ in work), default=0)
    tables = np.full((n, width), -1, dtype=np.int64)
    for i, (r, _) in enumerate(work):
        tables[i, : len(r.block_ids)] = r.block_ids
    start = np.fromiter((r.num_computed for r, _ in work), dtype=np.int64, count=n)
    counts = np.fromiter((k for _, k in work), dtype=np.int64, count=n)
    tokens = np.fromiter((t for r, k in work for t in r.token_slice(r.num_computed, k)), dtype=np.int64,
                         count=int(counts.sum()))
    return Batch(
        iteration=iteration,
        block_size=block_size,
        request_ids=np.fromiter((r.request_id for r, _ in work), dtype=np.int64, count=n),
        start_pos=start,
        num_tokens=counts,
        token_ids=tokens,
        sample=np.fromiter((r.num_computed + k == r.num_tokens for r, k in work), dtype=bool, count=n),
        block_tables=tables,
        num_generated=np.fromiter((len(r.output_ids) for r, _ in work), dtype=np.int64, count=n),
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
