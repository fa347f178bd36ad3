"""The KV side of a request's way in and out: starting, being preempted, being rejected, reservations.

Notes
-----
The scheduler decides the order (policy order, the three passes, the budgets); `Admission` keeps
what each decision does to a request and its KV blocks, and counts the outcomes for the Decision:

- a request that can never run (its worst case outgrows the KV pool, or, with chunked prefill off,
  its prompt outgrows an iteration's prefill room) is rejected on arrival;
- starting (admitting, or resuming after a preemption) swaps the request's blocks back in when they
  were swapped out, and moves it to PREFILL, or to DECODE when only its last sampled token is left;
- preemption swaps a request's blocks out when mode "swap" has room in the swap pool, and otherwise
  drops them: the request recomputes from the start;
- preemption mode "reject" promises each admitted request its worst case (prompt + max_tokens) in
  blocks, so it never waits for KV later; a request whose promise cannot be kept is rejected
  instead, and free blocks promised to others are not free for anyone else.
"""
from __future__ import annotations

from itertrace.profiler.scheduling.batch import SwapPlan
from itertrace.profiler.scheduling.budget import prefill_room
from itertrace.profiler.scheduling.decision import Event, EventKind, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import WaitQueue
from itertrace.profiler.scheduling.request import Phase, PreemptKind, Reason, Request


def outgrows_pool(tokens: int, num_blocks: int, block_size: int) -> bool:
    """Whether `tokens` tokens of KV cache (a request's prompt and output) need more blocks than the pool has."""
    return -(-tokens // block_size) > num_blocks


def outgrows_prefill(prompt_tokens: int, config: SchedulerConfig) -> bool:
    """Whether, with chunked prefill off, a prompt of `prompt_tokens` outgrows an iteration's prefill room."""
    return not config.chunked_prefill and prompt_tokens > prefill_room(config)


class Admission:
    """Starts, preempts and rejects requests; holds mode "reject"'s reservations and the outcome counts."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager, waiting: WaitQueue,
                 events: list[Event | TokenEvents]) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting = waiting  # the scheduler's queue: a rejected request leaves it
        self.events = events  # the scheduler's event list
        self.reserved: dict[int, int] = {}  # preemption mode "reject": blocks promised per request
        # since the last decision; the scheduler hands them out and zeroes them
        self.counts = {"admitted": 0, "resumed": 0, "preempted": 0, "rejected": 0}

    def never_fits(self, req: Request) -> bool:
        """Whether the request can never run: its worst case outgrows the KV pool, or, with chunked
        prefill off, its prompt outgrows the prefill room of an iteration."""
        tokens = len(req.prompt_ids) + req.sampling.max_tokens
        return (outgrows_pool(tokens, self.blocks.device.num_blocks, self.blocks.block_size)
                or outgrows_prefill(len(req.prompt_ids), self.config))

    # ---- starting, giving way, turning away -----------------------------------------------------------
    def start(self, req: Request, swap: SwapPlan, iteration: int) -> None:
        """Admit or resume a request the budgets and blocks allow (the caller then spends them)."""
        resumed = req.phase is Phase.PREEMPTED
        if req.swap_slots:
            swap.swap_in.extend(self.blocks.swap_in(req))
        phase = Phase.DECODE if req.tokens_left_to_compute == 1 and req.output_ids else Phase.PREFILL
        req.move(phase, Reason.RESUMED if resumed else Reason.ADMITTED, iteration)
        if req.first_scheduled_iteration is None:
            req.first_scheduled_iteration = iteration
        self.counts["resumed" if resumed else "admitted"] += 1
        kind = EventKind.RESUME if resumed else EventKind.ADMIT
        self.events.append(Event(req.request_id, iteration, kind, req.transitions[-1].reason))

    def preempt(self, req: Request, swap: SwapPlan, iteration: int) -> None:
        """Take a running request's blocks away: swap them out, or drop them to recompute later.

        The caller takes the request out of the running set (and, in continuous mode, back to the queue).
        """
        req.move(Phase.PREEMPTED, Reason.KV_EXHAUSTED, iteration)
        if self.config.preemption is PreemptKind.SWAP and len(req.block_ids) <= self.blocks.swap.num_free:
            swap.swap_out.extend(self.blocks.swap_out(req))
        else:
            # at once, even while the device reads them (overlap mode): the iteration that reuses them
            # runs after that one on the device
            self.blocks.free(req, at_once=True)
            req.num_computed = 0
        req.num_preemptions += 1
        req.enqueued_iteration = iteration
        self.counts["preempted"] += 1
        self.events.append(Event(req.request_id, iteration, EventKind.PREEMPT, Reason.KV_EXHAUSTED))

    def reject(self, req: Request, reason: Reason, iteration: int) -> None:
        req.move(Phase.REJECTED, reason, iteration)
        self.counts["rejected"] += 1
        self.events.append(Event(req.request_id, iteration, EventKind.REJECT, reason))
        self.waiting.remove(req)

    # ---- preemption mode "reject": worst-case reservations ------------------------------------------
    def worst_blocks(self, req: Request) -> int:
        return self.blocks.blocks_for(len(req.prompt_ids) + req.sampling.max_tokens)

    def reserve(self, req: Request, iteration: int) -> bool:
        """Promise the request its worst-case blocks, or reject it: it never waits for KV."""
        need = self.worst_blocks(req) - len(req.block_ids)
        if need > self.blocks.device.num_free - self.promised():
            self.reject(req, Reason.NO_KV_FOR_ADMISSION, iteration)
            return False
        self.reserved[req.request_id] = need
        return True

    def update(self, req: Request) -> None:
        """What is still promised to a request with reserved blocks: its worst case less what it holds."""
        if req.request_id in self.reserved:
            self.reserved[req.request_id] = max(0, self.worst_blocks(req) - len(req.block_ids))

    def promised(self, exclude: Request | None = None) -> int:
        skip = exclude.request_id if exclude is not None else None
        return sum(n for rid, n in self.reserved.items() if rid != skip)

    def release(self, request_id: int) -> None:
        """The request is done (finished, canceled): nothing is promised to it any more."""
        self.reserved.pop(request_id, None)
