"""One iteration's budget: tokens, sequences, the prefill cap under the decode reservation, and what ran out.

Notes
-----
`decode_reserve` keeps a share of the token budget that prefill may never use (`prefill_room`); and
once decodes are scheduled, prefill may use no more than the tokens they left. A decode draws on the
whole token budget, a prefill only on the prefill cap: one too long for the room left is chunked
when chunked prefill is on, and a recompute after preemption is chunked even when it is off (its
prompt fit, but prompt and output may not). `limit` says what stopped the iteration taking more work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from itertrace.profiler.scheduling.decision import Limit, SchedulerConfig
from itertrace.profiler.scheduling.request import Request


def prefill_room(config: SchedulerConfig) -> int:
    """Tokens per iteration that prefill may use: the budget less the decode reservation."""
    return config.max_num_batched_tokens - int(config.decode_reserve * config.max_num_batched_tokens)


@dataclass
class Budget:
    """What is left of one iteration's budget, and the work taken one by one so far."""

    tokens: int
    prefill_cap: int  # tokens left for prefill after the decode reservation
    seqs: int
    limit: Limit = Limit.QUEUE_EMPTY
    work: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens) taken one by one

    def chunk(self, req: Request, chunked_prefill: bool) -> int:
        """Tokens the request may run now under the token budget (0: not this iteration)."""
        want = req.tokens_left_to_compute
        is_decode = want == 1 and bool(req.output_ids)
        room = self.tokens if is_decode else self.prefill_cap
        if want <= room:
            return want
        # A recompute can outgrow a prompt that fit: it is chunked even when chunked prefill is off.
        if (chunked_prefill or req.num_preemptions) and room > 0:
            return room
        self.limit = Limit.DECODE_RESERVE if room < self.tokens and want <= self.tokens else Limit.TOKEN_BUDGET
        return 0
