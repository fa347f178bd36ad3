"""One iteration's choice: the passes over running decodes, running prefills and the queue.

Notes
-----
Continuous mode rebuilds membership every iteration, in three passes, each in policy order:
running decodes (one token each), running prefills (a chunk each), then the queue (new and
preempted requests). A running request that needs a KV block when none is free preempts the
lowest-ranked running request not yet scheduled this iteration (itself when none is left).
Static mode forms a batch only when the previous one is done, preallocating each member's KV for
its whole length; members keep their slots and blocks until the last member finishes.

The running decodes are kept as arrays (`DecodeRows`) from one iteration to the next, and the
decode pass runs on them at once: the same outcome as taking them one by one, with Python work only
for the rows that need a block, yield one, join or leave. Every decode fits the token budget: a
request becomes a decode only after a prefill chunk that took its share of the budget.
"""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.admission import Admission
from itertrace.profiler.scheduling.batch import SwapPlan
from itertrace.profiler.scheduling.batch_builder import DecodeRows, build_batch
from itertrace.profiler.scheduling.budget import Budget
from itertrace.profiler.scheduling.decision import Decision, Event, EventKind, Limit, Mode, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import SortKey, WaitQueue
from itertrace.profiler.scheduling.preemption import make_room, victim
from itertrace.profiler.scheduling.request import Phase, PreemptKind, Request


def _preempted_at(req: Request, iteration: int) -> bool:
    return req.phase is Phase.PREEMPTED and req.transitions[-1].iteration == iteration


class SchedulePasses:
    """The part of `Scheduler` that picks each iteration's batch; the state and the slots are scheduler.py's."""

    config: SchedulerConfig
    blocks: BlockManager
    waiting: WaitQueue
    running: list[Request]
    events: list[Event | TokenEvents]
    _key: SortKey
    _admission: Admission
    _swap: SwapPlan
    _rows: DecodeRows | None
    _rows_run: int
    _prefill_room: int
    read_tokens: bool

    def schedule(self, iteration: int) -> Decision:
        """Choose this iteration's work: running members first, then the queue, all in policy order."""
        cfg = self.config
        self.blocks.reset_counters()
        self._swap = SwapPlan()
        budget = Budget(cfg.max_num_batched_tokens, self._prefill_room, cfg.max_num_seqs)
        rows = self._decode_rows()
        if len(rows) > budget.tokens:  # each decode joined with a token of its own iteration's budget
            raise RuntimeError(f"iteration {iteration}: {len(rows)} running decodes exceed the token budget")
        # members that are not decoding (prefills; static members waiting to start), in policy order
        live = []
        if len(self.running) > len(rows):  # every running decode has a row
            live = sorted((r for r in self.running if r.phase is not Phase.DECODE and not r.phase.terminal),
                          key=self._key)
        self._run_rows(rows, live, budget, iteration)
        for req in live:
            if req.phase.terminal or _preempted_at(req, iteration):
                continue  # preempted earlier in this pass
            if req.phase in (Phase.WAITING, Phase.PREEMPTED):  # static members waiting inside their batch
                self._try_start(req, budget, iteration)
            else:
                self._run_member(req, budget, live, iteration)  # decodes are scheduled: never victims
        if cfg.mode is Mode.STATIC:
            if not self.running:
                self._form_static_batch(budget, iteration)
            elif budget.limit is Limit.QUEUE_EMPTY:
                budget.limit = Limit.STATIC_BATCH
        elif self._admission.counts["preempted"]:
            budget.limit = Limit.KV_BLOCKS  # admitting now would take the blocks just reclaimed
        else:
            self._admit(budget, iteration)
        return self._decision(iteration, rows, budget)

    def _decode_rows(self) -> DecodeRows:
        """The running decodes as arrays, rebuilt from the requests after a cancel."""
        if self._rows is None:
            self._rows = DecodeRows(self.blocks.block_size, self._key)
            for req in self.running:
                if req.phase is Phase.DECODE:
                    self._rows.join(req)
        self._rows.merge()
        return self._rows

    def _run_rows(self, rows: DecodeRows, live: list[Request], budget: Budget, iteration: int) -> None:
        """Give every decode row its token; rows that need a block take one in policy order (see make_room)."""
        if not len(rows):
            return
        grow = rows.growing()
        yielded: list[int] = []
        if len(grow) > self.blocks.device.num_free:
            preempt = lambda req: self._preempt(req, iteration)  # noqa: E731
            granted, yielded = make_room(rows, live, grow.tolist(), self.blocks, self._key, preempt)
            grow = np.array(granted, dtype=np.int64)
        if len(grow):
            rows.grow(grow, self.blocks)
            admission = self._admission
            if admission.reserved:
                for i in grow.tolist():
                    admission.update(rows.reqs[i])
        if yielded:
            rows.leave(yielded)
            rows.merge()
        budget.tokens -= len(rows)
        if len(rows):
            budget.prefill_cap = min(budget.prefill_cap, budget.tokens)
        if budget.tokens == 0:
            budget.limit = Limit.TOKEN_BUDGET

    def _run_member(self, req: Request, budget: Budget, live: list[Request], iteration: int) -> None:
        """Give a running request its tokens, preempting lower-ranked members for KV blocks."""
        n = budget.chunk(req, self.config.chunked_prefill)
        if n == 0:
            return
        while not self.blocks.can_grow(req, n):
            yielding = victim(live, budget.work, req)
            self._preempt(yielding, iteration)
            if yielding is req:
                return
        self._take(req, n, budget, iteration)

    def _admit(self, budget: Budget, iteration: int) -> None:
        """Continuous mode: fill free slots from the queue in policy order."""
        while (req := self.waiting.peek()) is not None:
            if len(self.running) >= budget.seqs:
                budget.limit = Limit.SEQ_BUDGET
                return
            if not self._try_start(req, budget, iteration):
                if req.phase is Phase.REJECTED:
                    continue  # preemption mode "reject" refused it; the next one may fit
                return
            self._enter(self.waiting.pop())
        budget.limit = Limit.QUEUE_EMPTY

    def _form_static_batch(self, budget: Budget, iteration: int) -> None:
        """Static mode: no batch is running; take up to `max_num_seqs` requests in policy order.

        Like a static-batching server, the batch preallocates each member's KV for its whole length
        (prompt + max_tokens), so members never wait for blocks or get preempted mid-batch.
        """
        while (req := self.waiting.peek()) is not None and len(self.running) < budget.seqs:
            need = self._admission.worst_blocks(req)
            if need > self.blocks.device.num_free:
                budget.limit = Limit.KV_BLOCKS
                break
            self.blocks.grow_to(req, need)
            self._enter(self.waiting.pop())
        else:
            budget.limit = Limit.SEQ_BUDGET if self.waiting else Limit.QUEUE_EMPTY
        for req in self.running:
            self._try_start(req, budget, iteration)

    def _try_start(self, req: Request, budget: Budget, iteration: int) -> bool:
        """Admit or resume a request into this iteration if the budgets and blocks allow."""
        n = budget.chunk(req, self.config.chunked_prefill)
        if n == 0:
            return False
        admission = self._admission
        if self.config.preemption is PreemptKind.REJECT and req.request_id not in admission.reserved:
            if not admission.reserve(req, iteration):
                return False
        if self.blocks.blocks_needed(req, n) > self.blocks.device.num_free - admission.promised(req):
            budget.limit = Limit.KV_BLOCKS
            return False
        admission.start(req, self._swap, iteration)
        self._take(req, n, budget, iteration)
        return True

    def _take(self, req: Request, n: int, budget: Budget, iteration: int) -> None:
        """Spend budget and blocks on `n` of the request's tokens."""
        self.blocks.grow(req, n)
        self._admission.update(req)
        budget.tokens -= n
        if req.phase is Phase.DECODE:  # decode spends the reservation first
            budget.prefill_cap = min(budget.prefill_cap, budget.tokens)
        else:
            budget.prefill_cap -= n
            self.events.append(Event(req.request_id, iteration, EventKind.PREFILL_CHUNK, tokens=n))
        budget.work.append((req, n))
        if budget.tokens == 0:
            budget.limit = Limit.TOKEN_BUDGET

    def _preempt(self, req: Request, iteration: int) -> None:
        """Take a running request's blocks away (see Admission.preempt); in continuous mode it queues again."""
        self._admission.preempt(req, self._swap, iteration)
        if self.config.mode is Mode.CONTINUOUS:
            self._leave(req)
            self.waiting.push(req)

    def _decision(self, iteration: int, rows: DecodeRows, budget: Budget) -> Decision:
        """The decode rows, then the work taken one by one (prefills, admissions), as one batch."""
        work = budget.work
        batch, decode = rows.batch(iteration), len(rows)
        if work:
            batch = build_batch(batch, work, self.read_tokens)
            decode += sum(n for r, n in work if r.phase is Phase.DECODE)
        stalled = []
        if len(self.running) > len(rows) + len(work):  # someone holding a slot ran nothing
            scheduled = {r.request_id for r, _ in work}
            stalled = [r.request_id for r in self.running if not r.phase.terminal
                       and r.phase is not Phase.DECODE and r.request_id not in scheduled]
        self._rows_run = len(rows)
        counts = self._admission.counts  # gathered since the last decision: handed out, then reset
        decision = Decision(
            iteration=iteration,
            work=rows.work() + work if work else rows.work(),
            batch=batch,
            swap=self._swap,
            member_ids=self._members(),
            # static batching: finished members keep their slots until the batch is done
            finished_member_ids=([r.request_id for r in self.running if r.phase.terminal]
                                 if self.config.mode is Mode.STATIC else []),
            stalled_member_ids=stalled,
            limit=budget.limit,
            prefill_tokens=batch.num_tokens_total - decode,
            decode_tokens=decode,
            **counts,
        )
        for name in counts:
            counts[name] = 0
        return decision
