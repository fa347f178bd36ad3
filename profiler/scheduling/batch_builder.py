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
from itertools import chain, repeat

import numpy as np

from itertrace.profiler.scheduling.batch import Batch, JoinedTables, SamplingParams
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import SortKey
from itertrace.profiler.scheduling.request import Request

_NONE = np.empty(0, dtype=np.int64)  # no rows (never written)
_NEVER = 2**62  # iterations until something that never comes


def build_batch(head: Batch, work: list[tuple[Request, int]], read_tokens: bool = True) -> Batch:
    """The rows of `head` (the decode rows), then one row per (request, tokens this iteration) of `work`;
    the block tables are joined when first read (see JoinedTables).

    Without `read_tokens` (a runner that needs only how many tokens a row runs), prefill chunks carry
    -1 for their tokens, so that synthetic prompts are never made."""
    columns, decodes, chunks, at = [], [], [], 0  # columns: (request id, start, tokens, sample, generated)
    for r, k in work:  # one pass over the requests
        pos, outputs, end = r.num_computed, len(r.output_ids), len(r.prompt_ids) + len(r.output_ids)
        columns.append((r.request_id, pos, k, pos + k == end, outputs))
        if k == 1 and outputs and pos == end - 1:
            decodes.append((at, r.output_ids[-1]))  # a decode: its last sampled token
        elif read_tokens:
            chunks.append((at, k, r.token_slice(pos, k)))
        at += k
    tokens = np.full(at, -1, dtype=np.int64)
    for at, k, chunk in chunks:
        tokens[at: at + k] = chunk
    for at, token in decodes:
        tokens[at] = token
    ids, start, counts, sample, generated = np.array(columns, dtype=np.int64).reshape(len(work), 5).T
    join = np.concatenate
    return Batch(
        iteration=head.iteration,
        block_size=head.block_size,
        request_ids=join((head.request_ids, ids)),
        start_pos=join((head.start_pos, start)),
        num_tokens=join((head.num_tokens, counts)),
        token_ids=join((head.token_ids, tokens)),
        sample=join((head.sample, sample.astype(bool))),
        block_tables=JoinedTables(head.block_tables, [(r.block_ids, len(r.block_ids)) for r, _ in work]),
        num_generated=join((head.num_generated, generated)),
        sampling=head.sampling + tuple(r.sampling for r, _ in work),
    )


def _tables(reqs: list[Request], width: int) -> np.ndarray:
    """[len(reqs), width] the requests' block tables, padded with -1."""
    return np.array([r.block_ids + [-1] * (width - len(r.block_ids)) for r in reqs], dtype=np.int64).reshape(
        len(reqs), width)


def _padded(tables: np.ndarray, width: int) -> np.ndarray:
    """Block tables padded with -1 to `width` columns (at least as many as they have): themselves, or a new array."""
    if tables.shape[1] == width:
        return tables
    wider = np.full((len(tables), width), -1, dtype=np.int64)
    wider[:, : tables.shape[1]] = tables
    return wider


class DecodeRows:
    """The running decodes as arrays in policy order; every row runs one token per iteration.

    Requests stay the source of truth (the scheduler updates them every iteration); these arrays are
    a copy kept in step with them. Arrays handed out in a Batch are never written again, but for the
    block tables' growth that Batch allows: a growing row's new block goes into its -1 entry in
    place (`grow`); every other update makes new arrays.
    """

    def __init__(self, block_size: int, key: SortKey) -> None:
        self.block_size = block_size
        self._block_size = np.int64(block_size)  # as an operand: cheaper than a Python int
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
        self._work: list[tuple[Request, int]] | None = None
        # iterations until a row samples its last token (min of last_step - num_generated), and until a row
        # needs a new block (min of room - pos): most iterations check an int instead of the arrays
        self._finish_in = self._grow_in = _NEVER

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
        order = list(range(n))  # merged row -> row of (current rows, then new rows)
        for i in sorted(set(self._leaving), reverse=True):
            del self.reqs[i], self._sampling[i], order[i]
        self._leaving = []
        new = sorted(self._joining, key=self._key)
        self._joining = []
        at = [bisect.bisect_left(self.reqs, self._key(r), key=self._key) for r in new]  # keys are evaluated now
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
        self.tables = np.concatenate((_padded(self.tables, width), _tables(new, width))).take(order, axis=0)
        self._count_down()
        stops = set(chain.from_iterable(r.sampling.stop_token_ids for r in new if not r.sampling.ignore_eos))
        if not stops <= self._stop_ids:
            self._stop_ids |= stops
            self._stops = np.array(sorted(self._stop_ids), dtype=np.int64)
        self._batch_parts = self._work = None

    def _count_down(self) -> None:
        """Set _finish_in and _grow_in from the arrays."""
        if len(self.reqs):
            self._finish_in = int((self.last_step - self.num_generated).min())
            self._grow_in = int((self.room - self.pos).min())
        else:
            self._finish_in = self._grow_in = _NEVER

    def growing(self) -> np.ndarray:
        """[G] rows whose next token starts a new KV block, in row order."""
        if self._grow_in > 0:
            return _NONE
        return (self.pos >= self.room).nonzero()[0]

    def grow(self, rows: np.ndarray, blocks: BlockManager) -> None:
        """Give each of `rows` ([G], in row order) one more KV block, in its request and in its table row.

        The block goes into the tables in place, at the -1 entry where the row's next token goes (as
        Batch allows); a row past the tables' last column makes new, wider tables instead.
        """
        room = self.room[rows]
        self.room[rows] = room + self._block_size  # room is never handed out
        self._grow_in = int((self.room - self.pos).min())
        new = blocks.append_blocks([self.reqs[i] for i in rows.tolist()])
        self._put_blocks(rows, np.floor_divide(room, self._block_size, room), new)  # the column where each goes

    def _put_blocks(self, rows: np.ndarray, column: np.ndarray, new: list[int] | np.ndarray) -> None:
        """A new block for each of `rows` (`new`, taken for them in that order) into its table at `column`."""
        try:
            self.tables[rows, column] = new
        except IndexError:  # past the last column (nothing was written)
            width = self.tables.shape[1]
            while int(column.max()) >= width:
                width = 2 * width + 1
            self.tables = _padded(self.tables, width)
            self.tables[rows, column] = new

    def steps_to_finish(self) -> int:
        """Iterations the rows run before one of them samples its last token (max_tokens): none of these
        iterations ends a row on length, the next one does."""
        return self._finish_in

    def first_stop(self, tokens: np.ndarray) -> int:
        """The first step of `tokens` ([steps, D], the rows' coming tokens) where a row may stop on a stop
        token (any row's stop token counts: the caller runs that iteration one by one); steps if none."""
        if not len(self._stops):
            return len(tokens)
        hit = np.isin(tokens, self._stops).any(axis=1).nonzero()[0]
        return int(hit[0]) if len(hit) else len(tokens)

    def blocks_ahead(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """The KV blocks the rows take in the next `steps` iterations: (step [N], row [N]), ordered by step,
        then row, as `grow` takes them iteration by iteration."""
        bs = self.block_size
        first = self.room - self.pos  # [D] the step whose token needs the row's next block
        if steps <= bs:  # a block each at most
            row = (first < steps).nonzero()[0]
            step = first[row]
            order = step.argsort(kind="stable")
            return step[order], row[order]
        counts = np.maximum(0, (steps - first + bs - 1) // bs)
        row = np.repeat(np.arange(len(self.reqs), dtype=np.int64), counts)
        nth = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        step = np.repeat(first, counts) + bs * nth
        order = np.lexsort((row, step))
        return step[order], row[order]

    def grow_ahead(self, steps: np.ndarray, rows: np.ndarray, new: np.ndarray) -> None:
        """Put the blocks of `blocks_ahead` at once (`new`: those the rows' requests took for them, in that
        order): in the same places as `grow` would iteration by iteration."""
        self._put_blocks(rows, (self.pos[rows] + steps) // self._block_size, new)
        self.room += self._block_size * np.bincount(rows, minlength=len(self.reqs))
        self._grow_in = int((self.room - self.pos).min())

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
        return Batch(iteration=iteration, block_size=self.block_size, request_ids=self.request_ids,
                     start_pos=self.pos, num_tokens=ones, token_ids=self.tokens, sample=sample,
                     block_tables=self.tables, num_generated=self.num_generated, sampling=sampling)

    def may_stop(self, tokens: np.ndarray) -> list[int]:
        """Rows that may finish on `tokens` (their max_tokens reached, or a stop token); the caller decides."""
        if self._finish_in > 0 and not len(self._stops):
            return []
        ending = self.num_generated >= self.last_step
        if len(self._stops) == 1:
            ending |= tokens == self._stops[0]
        elif len(self._stops):
            ending |= np.isin(tokens, self._stops)
        return ending.nonzero()[0].tolist()

    def advance(self, tokens: np.ndarray, steps: int = 1) -> None:
        """After `steps` forward passes: each row cached `steps` positions and last sampled `tokens` (row order)."""
        self.pos = self.pos + steps
        self.num_generated = self.num_generated + steps
        self.tokens = tokens
        self._finish_in -= steps
        self._grow_in -= steps
