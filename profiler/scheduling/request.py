"""A request's full state and the record of every transition it makes."""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from itertrace.profiler.scheduling.batch import SamplingParams


class Phase(enum.Enum):
    """Where a request stands; the last four are terminal."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    PREEMPTED = "preempted"
    FINISHED_STOP = "finished_stop"
    FINISHED_LENGTH = "finished_length"
    CANCELED = "canceled"
    REJECTED = "rejected"

    # set below: plain attributes, because enum hashing is slow on the per-iteration path
    terminal: bool
    running: bool


for _p in Phase:
    _p.terminal = _p in (Phase.FINISHED_STOP, Phase.FINISHED_LENGTH, Phase.CANCELED, Phase.REJECTED)
    _p.running = _p in (Phase.PREFILL, Phase.DECODE)


class Reason(enum.Enum):
    """Why a transition happened."""

    ARRIVED = "arrived"
    ADMITTED = "admitted"  # picked from the queue into a batch
    PROMPT_DONE = "prompt_done"  # last prefill chunk ran; decoding starts
    STOP_TOKEN = "stop_token"
    MAX_TOKENS = "max_tokens"
    KV_EXHAUSTED = "kv_exhausted"  # preempted: a higher-ranked request needed blocks
    RESUMED = "resumed"  # a preempted request re-entered a batch
    CANCEL_REQUESTED = "cancel_requested"
    TOO_LONG = "too_long"  # can never fit: prompt over the token budget (no chunked prefill) or KV pool too small
    NO_KV_FOR_ADMISSION = "no_kv_for_admission"  # preemption mode "reject": no room, admission refused


class PreemptKind(enum.Enum):
    """What happens to a preempted request's KV blocks."""

    RECOMPUTE = "recompute"  # freed; the request later re-runs prompt + generated tokens as prefill
    SWAP = "swap"  # copied to the swap pool and copied back on resume
    REJECT = "reject"  # never preempt: admission reserves the worst case, and is refused when it cannot


@dataclass(frozen=True)
class Transition:
    """One recorded state change."""

    iteration: int
    src: Phase
    dst: Phase
    reason: Reason


@dataclass(eq=False)  # identity equality: list.remove and `in` must not compare every field
class Request:
    """A request as the scheduler sees it. Token ids are prompt followed by output."""

    request_id: int
    prompt_ids: Sequence[int]  # a list, or a SynthPrompt (made when first read)
    sampling: SamplingParams
    arrival_ns: int = 0
    priority: int = 0  # lower is more urgent, as in vLLM
    tenant: str = "default"
    deadline_ns: int | None = None  # absolute time by which the request should finish
    cancel_at_iteration: int | None = None  # workloads may script a cancellation
    output_ids: list[int] = field(default_factory=list)
    phase: Phase = Phase.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache (prompt first, then output)
    block_ids: list[int] = field(default_factory=list)  # the block table, in position order; only appended to
    # (freeing or swapping the blocks gives the request a new list: see batch.JoinedTables)
    swap_slots: list[int] = field(default_factory=list)  # where the blocks went on swap-out
    stop_reason: Reason | None = None
    transitions: list[Transition] = field(default_factory=list)
    enqueued_iteration: int = 0  # when it last joined the queue (for aging)
    first_scheduled_iteration: int | None = None
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_slice(self, start: int, n: int) -> list[int]:
        """Tokens [start, start + n) of prompt + output, without joining the two whole lists."""
        p = len(self.prompt_ids)
        if start >= p:
            return self.output_ids[start - p : start - p + n]
        if start + n <= p:
            return self.prompt_ids[start : start + n]
        return self.prompt_ids[start:] + self.output_ids[: start + n - p]

    @property
    def tokens_left_to_compute(self) -> int:
        """Tokens to run before the next sample: the prompt (or, after recompute, all of it) or 1."""
        return self.num_tokens - self.num_computed

    @property
    def prompt_left(self) -> int:
        return max(0, len(self.prompt_ids) - self.num_computed)

    @property
    def remaining_work(self) -> int:
        """Tokens still to process or generate if it runs to max_tokens: the SRW policy's key."""
        return self.tokens_left_to_compute + self.sampling.max_tokens - len(self.output_ids)

    def move(self, dst: Phase, reason: Reason, iteration: int) -> None:
        """Change phase and record why; terminal states are final."""
        if self.phase.terminal:
            raise RuntimeError(f"request {self.request_id} is {self.phase.value}; cannot move to {dst.value}")
        self.transitions.append(Transition(iteration, self.phase, dst, reason))
        self.phase = dst
        if dst.terminal:
            self.stop_reason = reason
