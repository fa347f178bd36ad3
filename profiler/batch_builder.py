"""Turning scheduled requests into a Batch of arrays, and the running decodes kept as arrays.

Notes
-----
Most rows of a busy server's iterations are decodes: the same requests, one token each. `DecodeRows`
keeps those rows' arrays from one iteration to the next, in policy order, so the scheduler hands out
their part of the batch with a few vector operations; only the rows that join, leave, or cross into
a new KV block (about one in `block_size`) cost Python work. Prefill chunks and newly admitted
requests are few per iteration and go through `build_batch`, one row each.
"""
from __future__ import annotations

import bisect
from itertools import chain, compress, repeat

import numpy as np

from itertrace.profiler.batch import Batch, SamplingParams
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.policies import SortKey
from itertrace.profiler.request import Request


def build_batch(head: Batch, work: list[tuple[Request, int]]) -> Batch:
    """The rows of `head` (the decode rows), then one row per (request, tokens this iteration) of `work`."""
    ids, start, counts, sample, generated, tokens = [], [], [], [], [], []
    for r, k in work:  # one pass over the requests
        pos, outputs = r.num_computed, len(r.output_ids)
        ids.append(r.request_id)
        start.append(pos)
        counts.append(k)
        sample.append(pos + k == len(r.prompt_ids) + outputs)
        generated.append(outputs)
        if k == 1 and outputs and pos == len(r.prompt_ids) + outputs - 1:
            tokens.append(r.output_ids[-1])  # a decode: its last sampled token
        else:
            tokens += r.token_slice(pos, k)
    lengths = np.array([len(r.block_ids) for r, _ in work], dtype=np.int64)
    d, width = head.num_seqs, head.block_tables.shape[1]
    tables = np.full((d + len(work), max(width, int(lengths.max(initial=0)))), -1, dtype=np.int64)
    tables[:d, :width] = head.block_tables
    held = np.arange(tables.shape[1]) < lengths[:, None]  # [len(work), width]
    tables[d:][held] = list(chain.from_iterable(r.block_ids for r, _ in work))
    join = np.concatenate
    return Batch(
        iteration=head.iteration,
        block_size=head.block_size,
        request_ids=join((head.request_ids, np.array(ids, dtype=np.int64))),
        start_pos=join((head.start_pos, np.array(start, dtype=np.int64))),
        num_tokens=join((head.num_tokens, np.array(counts, dtype=np.int64))),
        token_ids=join((head.token_ids, np.array(tokens, dtype=np.int64))),
        sample=join((head.sample, np.array(sample, dtype=bool))),
        block_tables=tables,
        num_generated=join((head.num_generated, np.array(generated, dtype=np.int64))),
        sampling=head.sampling + tuple(r.sampling for r, _ in work),
    )


class DecodeRows:
    """The running decodes as arrays in policy order; every row runs one token per iteration.

    Requests stay the source of truth (the scheduler updates them every iteration); these arrays are
    a copy kept in step with them. Arrays handed out in a Batch are never written again: every update
    makes new arrays, so a batch keeps describing the iteration it was made for.
    """

    def __init__(self, block_size: int, key: SortKey) -> None:
        self.block_size = block_size
        self._key = key
        self.reqs: list[Request] = []  # [D] in policy order
        self._sampling: list[SamplingParams] = []
        none = np.empty(0, dtype=np.int64)
        self.request_ids = self.pos = self.tokens = self.num_generated = none  # [D] each, as in a Batch
        self.last_step = none  # [D] num_generated when a row samples its last token (max_tokens - 1)
        self.room = none  # [D] positions the row's blocks cover (blocks held x block_size)
        self.tables = np.empty((0, 0), dtype=np.int64)  # [D, width] block ids, padded with -1
        self._stop_ids: set[int] = set()  # every stop token some row may stop on (kept a superset)
        self._stops = none
        self._joining: list[Request] = []
        self._leaving: list[int] = []
        self._batch_parts: tuple | None = None  # (sampling tuple, ones, all-true) while the rows are unchanged
        self._tables_out = False  # self.tables is in a batch already handed out: copy before writing
        self._work: list[tuple[Request, int]] | None = None

    def __len__(self) -> int:
        return len(self.reqs)

    def join(self, req: Request) -> None:
        """A request became a running decode; it takes its row at the next `merge`."""
        self._joining.append(req)

    def leave(self, rows: list[int]) -> None:
        """These rows' requests stopped decoding (finished, preempted); they go at the next `merge`."""
        self._leaving.extend(rows)

    def merge(self) -> None:
        """Drop the rows that left, and give each joining request its row at its place in policy order."""
        if not self._leaving and not self._joining:
            return
        n = len(self.reqs)
        keep = np.ones(n, dtype=bool)
        keep[self._leaving] = False
        self._leaving = []
        mask = keep.tolist()
        self.reqs = list(compress(self.reqs, mask))
        self._sampling = list(compress(self._sampling, mask))
        order = keep.nonzero()[0]  # merged row -> row of (current rows, then new rows)
        new = sorted(self._joining, key=self._key)
        self._joining = []
        if new:
            at = [bisect.bisect_left(self.reqs, self._key(r), key=self._key) for r in new]  # keys are evaluated now
            order = order.tolist()
            for j in reversed(range(len(new))):
                self.reqs.insert(at[j], new[j])
                self._sampling.insert(at[j], new[j].sampling)
                order.insert(at[j], n + j)
            order = np.fromiter(order, dtype=np.int64, count=len(order))
        # the per-row columns go through one [6, D] array: one concatenate and one gather for all of them
        bs = self.block_size
        columns = np.array([(r.request_id, r.num_computed, r.output_ids[-1], len(r.output_ids),
                             r.sampling.max_tokens - 1, len(r.block_ids) * bs) for r in new], dtype=np.int64)
        current = np.array((self.request_ids, self.pos, self.tokens, self.num_generated, self.last_step, self.room))
        merged = np.concatenate((current, columns.reshape(len(new), 6).T), axis=1).take(order, axis=1)
        self.request_ids, self.pos, self.tokens, self.num_generated, self.last_step, self.room = merged
        width = max(self.tables.shape[1], max((len(r.block_ids) for r in new), default=0))
        tables = np.array([r.block_ids + [-1] * (width - len(r.block_ids)) for r in new], dtype=np.int64)
        current = self.tables if self.tables.shape[1] == width else self._widened(width)
        self.tables = np.concatenate((current, tables.reshape(len(new), width))).take(order, axis=0)
        self._tables_out = False
        stops = set(chain.from_iterable(r.sampling.stop_token_ids for r in new if not r.sampling.ignore_eos))
        if not stops <= self._stop_ids:
            self._stop_ids |= stops
            self._stops = np.array(sorted(self._stop_ids), dtype=np.int64)
        self._batch_parts = self._work = None

    def growing(self) -> np.ndarray:
        """Rows whose next token starts a new KV block."""
        return (self.pos >= self.room).nonzero()[0]

    def grow(self, rows: list[int], blocks: BlockManager) -> None:
        """Give each of `rows` one more KV block (in row order), in its request and in its table row."""
        room = self.room[rows]
        column = room // self.block_size  # [G] where each row's new block goes
        width = self.tables.shape[1]
        if int(column.max()) >= width:
            self.tables = self._widened(2 * width + 1)
        elif self._tables_out:
            self.tables = self.tables.copy()
        self._tables_out = False
        self.tables[rows, column] = blocks.append_blocks([self.reqs[i] for i in rows])
        self.room[rows] = room + self.block_size  # room is never handed out

    def work(self) -> list[tuple[Request, int]]:
        """[(request, 1)] per row (one list, shared until the rows change)."""
        if self._work is None:
            self._work = list(zip(self.reqs, repeat(1)))
        return self._work

    def batch(self, iteration: int) -> Batch:
        """This iteration's decode rows: one token each, every one sampled."""
        if self._batch_parts is None:
            n = len(self.reqs)
            self._batch_parts = (tuple(self._sampling), np.ones(n, dtype=np.int64), np.ones(n, dtype=bool))
        sampling, ones, sample = self._batch_parts
        self._tables_out = True
        return Batch(iteration=iteration, block_size=self.block_size, request_ids=self.request_ids,
                     start_pos=self.pos, num_tokens=ones, token_ids=self.tokens, sample=sample,
                     block_tables=self.tables, num_generated=self.num_generated, sampling=sampling)

    def may_stop(self, tokens: np.ndarray) -> list[int]:
        """Rows that may finish on `tokens` (their max_tokens reached, or a stop token); the caller decides."""
        ending = self.num_generated >= self.last_step
        if len(self._stops) == 1:
            ending |= tokens == self._stops[0]
        elif len(self._stops):
            ending |= np.isin(tokens, self._stops)
        return ending.nonzero()[0].tolist()

    def advance(self, tokens: np.ndarray) -> None:
        """After the forward pass: each row cached one position and sampled `tokens` (row order)."""
        self.pos = self.pos + 1
        self.num_generated = self.num_generated + 1
        self.tokens = tokens

    def _widened(self, width: int) -> np.ndarray:
        """The block tables at least `width` wide, as a new array."""
        if width <= self.tables.shape[1]:
            return self.tables.copy()
        wider = np.full((len(self.tables), width), -1, dtype=np.int64)
        wider[:, : self.tables.shape[1]] = self.tables
        return wider
