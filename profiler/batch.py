"""What the scheduler hands a runner for one iteration, and the interface every runner implements."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


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

    A NamedTuple rather than a dataclass: the scheduler makes one per sequence per iteration.
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


@dataclass(frozen=True)
class Batch:
    """Everything a runner needs for one forward pass, in scheduling order."""

    iteration: int
    seqs: tuple[SeqWork, ...]
    block_size: int

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)


@dataclass
class SwapPlan:
    """KV block copies to make before the forward pass: (device block, swap slot) pairs."""

    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (swap slot, device block)


class Runner(Protocol):
    """A model behind the engine loop. Each method is one NVTX phase of the iteration.

    `prepare` builds device inputs (positions, slot mapping, block tables), `forward` runs the model
    and returns logits for the sequences with `sample=True` (in batch order), `sample` turns those
    logits into one token id per sampling sequence, keyed by request id.
    """

    name: str
    simulated: bool

    def prepare(self, batch: Batch) -> object: ...

    def forward(self, prepared: object) -> object: ...

    def sample(self, batch: Batch, logits: object) -> dict[int, int]: ...

    def swap(self, plan: SwapPlan) -> None: ...

    def release(self, request_id: int) -> None: ...
