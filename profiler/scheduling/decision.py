"""What the scheduler decides and says: modes, limits, events, its configuration, one iteration's decision."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from itertrace.profiler.scheduling.batch import Batch, SwapPlan
from itertrace.profiler.scheduling.policies import Policy
from itertrace.profiler.scheduling.request import PreemptKind, Reason, Request


class Mode(enum.Enum):
    STATIC = "static"
    CONTINUOUS = "continuous"


class Limit(enum.Enum):
    """What stopped the scheduler from adding more work to an iteration."""

    QUEUE_EMPTY = "queue_empty"
    SEQ_BUDGET = "seq_budget"
    TOKEN_BUDGET = "token_budget"
    DECODE_RESERVE = "decode_reserve"
    KV_BLOCKS = "kv_blocks"
    STATIC_BATCH = "static_batch"  # a static batch is running; nothing joins it


class EventKind(enum.Enum):
    ARRIVE = "arrive"
    ADMIT = "admit"
    PREFILL_CHUNK = "prefill_chunk"
    FIRST_TOKEN = "first_token"
    TOKEN = "token"
    PREEMPT = "preempt"
    RESUME = "resume"
    FINISH = "finish"
    CANCEL = "cancel"
    REJECT = "reject"


class Event(NamedTuple):
    """One request event; the engine stamps it with a time."""

    request_id: int
    iteration: int
    kind: EventKind
    reason: Reason | None = None
    tokens: int = 0  # prefill chunk size, or 1 for a token


class TokenEvents(NamedTuple):
    """`first_token` and `token` events of consecutive sampled rows, one per row (tokens=1 each), in batch order."""

    iteration: int
    request_ids: np.ndarray  # [n] int64
    first: np.ndarray  # [n] bool: the request's first token (kind first_token), else kind token


@dataclass(frozen=True)
class SchedulerConfig:
    mode: Mode = Mode.CONTINUOUS
    policy: Policy = Policy.FCFS
    max_num_seqs: int = 16  # sequence budget: batch capacity in slots
    max_num_batched_tokens: int = 2048  # token budget per iteration
    chunked_prefill: bool = True
    decode_reserve: float = 0.0  # share of the token budget that prefill may never use
    preemption: PreemptKind = PreemptKind.RECOMPUTE
    aging_iterations: int = 256

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("budgets must be at least 1")
        if not 0.0 <= self.decode_reserve < 1.0:
            raise ValueError("decode_reserve must be in [0, 1)")


@dataclass
class Decision:
    """What one iteration runs, and why."""

    iteration: int
    work: list[tuple[Request, int]]  # (request, tokens this iteration), in batch order
    batch: Batch
    swap: SwapPlan
    member_ids: list[int]  # every request holding a slot, finished static members included
    finished_member_ids: list[int]  # static batching: members already finished, slots still held
    stalled_member_ids: list[int]  # live members that got no work this iteration
    limit: Limit
    admitted: int = 0
    resumed: int = 0
    preempted: int = 0
    rejected: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
