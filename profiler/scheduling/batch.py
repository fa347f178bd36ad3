"""What the scheduler hands a runner for one iteration, and the interface every runner implements."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; `seed` makes the request's token stream reproducible."""

    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0  # 1.0 means no nucleus cut
    seed: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # fixed-length workloads: stop only on max_tokens


class SeqWork(NamedTuple):
    """One request's share of an iteration: a prompt chunk (prefill) or its last token (decode).

    The per-sequence view of a Batch (Batch.seqs, Batch.from_seqs), for simple runners and tests.
    """

    request_id: int
    token_ids: tuple[int, ...]  # tokens to run this iteration: [n]
    start_pos: int  # position of token_ids[0] in the sequence; KV for [0, start_pos) is already cached
    block_table: tuple[int, ...]  # KV block ids covering positions [0, start_pos + n)
    sample: bool  # True when this chunk reaches the sequence's end, so a next token is sampled
    sampling: SamplingParams
    num_generated: int  # output tokens the request already has (the sampler's step index)

    @property
    def context_len(self) -> int:
        """Tokens whose KV the attention reads after this iteration."""
        return self.start_pos + len(self.token_ids)


@dataclass  # not frozen: a frozen dataclass's __init__ took 1.4 us longer, every iteration
class Batch:
    """Everything a runner needs for one forward pass, as arrays in scheduling order.

    Arrays rather than per-sequence objects, so that a steady decode iteration costs the scheduler
    and the runner a few vector operations instead of Python work per sequence. `seqs` gives the
    same content as SeqWork tuples, for simple runners and tests.

    Whoever makes a batch never writes its arrays afterwards, with one exception, so that runners may
    keep what follows from an array for the next batch that brings it: a row of `block_tables` may
    take its next block in place, in the -1 entry where the sequence's next token goes, just before
    the batch of that token is handed out (the scheduler's decode rows grow so). Entries covering a
    sequence's context in a batch never change; an older batch's tables (and `seqs`) may show blocks
    taken later.
    """

    iteration: int
    block_size: int
    request_ids: np.ndarray  # [S] int64
    start_pos: np.ndarray  # [S] int64: position of each sequence's first token this iteration
    num_tokens: np.ndarray  # [S] int64: tokens each sequence runs this iteration (1 for a decode)
    token_ids: np.ndarray  # [T] int64: every sequence's tokens in turn (-1: unread, see Scheduler.read_tokens)
    sample: np.ndarray  # [S] bool: the chunk reaches the sequence's end, so a token is sampled
    block_tables: np.ndarray  # [S, max_blocks] int64, padded with -1; covers [0, start_pos + num_tokens)
    # (a property, set below: it joins a JoinedTables when first read)
    num_generated: np.ndarray  # [S] int64: output tokens each request already has
    sampling: tuple[SamplingParams, ...]  # [S]

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    @property
    def num_tokens_total(self) -> int:
        return len(self.token_ids)

    @property
    def context_lens(self) -> np.ndarray:
        """[S] tokens whose KV the attention reads after this iteration."""
        return self.start_pos + self.num_tokens

    @cached_property
    def sampled_ids(self) -> np.ndarray:
        """[sampled] request ids of the sequences with sample=True, in batch order (tokens come in this order)."""
        return self.request_ids[self.sample]

    @cached_property
    def seqs(self) -> tuple[SeqWork, ...]:
        ends = np.cumsum(self.num_tokens)
        out = []
        for i in range(self.num_seqs):
            n_blocks = -(-int(self.start_pos[i] + self.num_tokens[i]) // self.block_size)
            table = self.block_tables[i]
            held = int((table >= 0).sum())
            out.append(SeqWork(
                request_id=int(self.request_ids[i]),
                token_ids=tuple(int(t) for t in self.token_ids[ends[i] - self.num_tokens[i]: ends[i]]),
                start_pos=int(self.start_pos[i]),
                block_table=tuple(int(b) for b in table[:max(held, n_blocks)]),
                sample=bool(self.sample[i]),
                sampling=self.sampling[i],
                num_generated=int(self.num_generated[i]),
            ))
        return tuple(out)

    @classmethod
    def from_seqs(cls, iteration: int, seqs: tuple[SeqWork, ...] | list[SeqWork], block_size: int) -> Batch:
        """Build a batch from per-sequence work (tests, simple callers)."""
        width = max((len(s.block_table) for s in seqs), default=0)
        tables = np.full((len(seqs), width), -1, dtype=np.int64)
        for i, s in enumerate(seqs):
            tables[i, : len(s.block_table)] = s.block_table
        ints = lambda values: np.fromiter(values, dtype=np.int64, count=len(seqs))  # noqa: E731
        return cls(
            iteration=iteration,
            block_size=block_size,
            request_ids=ints(s.request_id for s in seqs),
            start_pos=ints(s.start_pos for s in seqs),
            num_tokens=ints(len(s.token_ids) for s in seqs),
            token_ids=np.fromiter((t for s in seqs for t in s.token_ids), dtype=np.int64),
            sample=np.fromiter((s.sample for s in seqs), dtype=bool, count=len(seqs)),
            block_tables=tables,
            num_generated=ints(s.num_generated for s in seqs),
            sampling=tuple(s.sampling for s in seqs),
        )


class JoinedTables(NamedTuple):
    """A batch's block tables as parts, to join when first read: the leading rows' table ([D, w]) and, for
    each row after them, a request's block list and how many of its blocks the row holds. A request's block
    list is only ever appended to (freeing or swapping its blocks gives it a new list), so the first
    entries of a list are the same whenever they are read."""

    head: np.ndarray
    rows: list[tuple[list[int], int]]

    def join(self) -> np.ndarray:
        """[D + len(rows), max_blocks] the rows in turn, padded with -1."""
        head, d = self.head, len(self.head)
        width = max(head.shape[1], max((n for _, n in self.rows), default=0))
        out = np.full((d + len(self.rows), width), -1, dtype=np.int64)
        out[:d, : head.shape[1]] = head
        for row, (blocks, n) in zip(out[d:], self.rows):
            row[:n] = blocks[:n]
        return out


def _block_tables(batch: Batch) -> np.ndarray:
    tables = batch._block_tables
    if type(tables) is JoinedTables:
        tables = batch._block_tables = tables.join()
    return tables


def _set_block_tables(batch: Batch, tables: np.ndarray | JoinedTables) -> None:
    batch._block_tables = tables


Batch.block_tables = property(_block_tables, _set_block_tables)  # the dataclass's __init__ sets it through this


@dataclass
class SwapPlan:
    """KV block copies to make before the forward pass: (device block, swap slot) pairs."""

    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (swap slot, device block)


class Placeholders(NamedTuple):
    """Overlap mode: the tokens of a batch that the iteration before it has not sampled yet when it is made.

    Among the batch's token ids, the j-th token the iteration before samples stands as `-1 - j` (`tokens`)
    until a runner puts it in; `at` are the places of such ids in a batch's token ids, `rows` the j of each.
    """

    at: np.ndarray  # [P] places in the token ids
    rows: np.ndarray  # [P] which of the previous iteration's sampled tokens each stands for

    @staticmethod
    def tokens(count: int) -> np.ndarray:
        """[count] the stand-ins of the `count` tokens an iteration samples, in sampling order."""
        return -1 - np.arange(count, dtype=np.int64)

    @classmethod
    def find(cls, token_ids: np.ndarray) -> Placeholders | None:
        """The stand-ins among `token_ids`; None if there are none."""
        at = np.flatnonzero(token_ids < 0)
        return cls(at, -1 - token_ids[at]) if len(at) else None


class Runner(Protocol):
    """A model behind the engine loop. Each method is one NVTX phase of the iteration.

    `prepare` builds device inputs (positions, slot mapping, block tables), `forward` runs the model
    and returns logits for the sequences with `sample=True` (in batch order), `sample` turns those
    logits into one token id per sampling sequence: an int64 array in the same order. What a runner
    can do besides is a protocol of its own: `BulkRunner`, `OverlapRunner`.
    """

    name: str
    simulated: bool
    reads_tokens: bool  # False: forward needs only how many tokens each row runs (see Scheduler.read_tokens)

    def prepare(self, batch: Batch) -> object: ...

    def forward(self, prepared: object) -> object: ...

    def sample(self, batch: Batch, logits: object) -> np.ndarray: ...

    def swap(self, plan: SwapPlan) -> None: ...

    def release(self, request_id: int) -> None: ...


@runtime_checkable
class BulkRunner(Runner, Protocol):
    """A runner that gives a stretch of iterations at once (the decode rows, and at most one prompt chunk of
    the same size in each): their times and tokens as arrays."""

    def decode_times(self, batch: Batch, steps: int) -> tuple[int, np.ndarray]:
        """Host ns (prepare) per iteration, and [steps] device ns (forward), of a batch and of the steps - 1
        after it, each row as many positions further as it runs tokens."""

    def decode_tokens(self, batch: Batch, steps: int) -> np.ndarray:
        """[steps, sampled] the tokens `sample` gives in those iterations (the same rows sample in each)."""

    def step_times(self, seqs: np.ndarray, tokens: np.ndarray, context: np.ndarray) -> tuple[int, np.ndarray]:
        """Host ns per iteration, and [n] device ns, of n iterations given each one's sequences, tokens and context
        tokens (the start positions and tokens of its rows, summed)."""


@runtime_checkable
class OverlapRunner(Runner, Protocol):
    """A runner that launches a forward pass and returns while it runs (overlap mode).

    `launch` takes the place of `swap` and `forward`, `collect` waits for the logits. A batch prepared
    then may hold `Placeholders` among its token ids, which `launch` puts in.
    """

    def launch(self, prepared: object, swap: SwapPlan, previous: np.ndarray | None, on_device) -> None:
        """Start the swaps and the forward pass of `prepared`, inside the context manager `on_device` on
        the thread that runs them (or, for a device on a virtual clock, on_device.span(start_ns, end_ns)),
        and return; placeholders take their tokens from `previous` (None: see `chains`)."""

    def collect(self) -> object:
        """Wait for the launched forward pass: its logits, as forward returns them."""

    def chains(self, batch: Batch) -> bool:
        """Whether the next iteration may be launched before `batch`'s (in flight) is collected, its
        placeholders filled on the device side."""
