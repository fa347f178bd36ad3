"""The iteration-level scheduler: at each iteration boundary, pick the batch. Imports no torch.

Notes
-----
Continuous mode rebuilds membership every iteration, in three passes, each in policy order:
running decodes (one token each), running prefills (a chunk each), then the queue (new and
preempted requests). A running request that needs a KV block when none is free preempts the
lowest-ranked running request not yet scheduled this iteration (itself when none is left).
Static mode forms a batch only when the previous one is done, preallocating each member's KV for
its whole length; members keep their slots and blocks until the last member finishes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from itertrace.profiler.batch import SwapPlan
from itertrace.profiler.batch_builder import SteadyDecode, build_batch
from itertrace.profiler.decision import Decision, Event, EventKind, Limit, Mode, SchedulerConfig
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.policies import WaitQueue, sort_key
from itertrace.profiler.request import Phase, PreemptKind, Reason, Request

__all__ = ["Decision", "Event", "EventKind", "Limit", "Mode", "Scheduler", "SchedulerConfig"]


def _zero_counts() -> dict[str, int]:
    return {"admitted": 0, "resumed": 0, "preempted": 0, "rejected": 0}


def _preempted_at(req: Request, iteration: int) -> bool:
    return req.phase is Phase.PREEMPTED and req.transitions[-1].iteration == iteration


@dataclass
class _Budget:
    tokens: int
    prefill_cap: int  # tokens left for prefill after the decode reservation
    seqs: int
    limit: Limit = Limit.QUEUE_EMPTY
    work: list[tuple[Request, int]] = field(default_factory=list)


class Scheduler:
    """Holds the queue and the batch; `schedule` and `postprocess` bracket every forward pass."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._key = sort_key(config.policy, config.aging_iterations)
        self.waiting = WaitQueue(self._key)  # new requests, and preempted ones in continuous mode
        self.running: list[Request] = []  # requests holding a slot (static: every member of the batch)
        self.events: list[Event] = []  # drained by the engine after each call
        self._reserved: dict[int, int] = {}  # preemption mode "reject": blocks promised per request
        self._swap = SwapPlan()
        self._counts = _zero_counts()  # since the last decision
        self._steady: SteadyDecode | None = None  # the all-decode batch to repeat, while nothing changes

    # ---- requests coming and going -------------------------------------------------------------
    def add(self, req: Request, iteration: int) -> None:
        """A request arrives; one that can never fit is rejected at once."""
        self.events.append(Event(req.request_id, iteration, EventKind.ARRIVE, Reason.ARRIVED))
        req.enqueued_iteration = iteration
        cfg = self.config
        too_long = self._worst_blocks(req) > self.blocks.device.num_blocks or (
            not cfg.chunked_prefill and len(req.prompt_ids) > self._prefill_room()
        )
        if too_long:
            self._reject(req, Reason.TOO_LONG, iteration)
        else:
            self.waiting.push(req)

    def cancel(self, request_id: int, iteration: int) -> bool:
        """Cancel a live request at an iteration boundary; its blocks are freed at once."""
        self._steady = None
        req = next((r for r in self.running if r.request_id == request_id), None)
        queued = req is None
        if queued:
            req = self.waiting.find(request_id)
        if req is None or req.phase.terminal:
            return False
        if queued:
            self.waiting.remove(req)
        req.move(Phase.CANCELED, Reason.CANCEL_REQUESTED, iteration)
        self.blocks.free(req)
        self._reserved.pop(request_id, None)
        self.events.append(Event(request_id, iteration, EventKind.CANCEL, Reason.CANCEL_REQUESTED))
        if not queued:
            if self.config.mode is Mode.CONTINUOUS:
                self.running.remove(req)
            else:
                self._end_static_batch_if_done()
        return True

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    # ---- one iteration ---------------------------------------------------------------------------
    def schedule(self, iteration: int) -> Decision:
        """Choose this iteration's work: running members first, then the queue, all in policy order."""
        cfg = self.config
        self.blocks.reset_counters()
        self._swap = SwapPlan()
        if self._steady is not None:
            decision = self._steady_decision(iteration)
            if decision is not None:
                return decision
            self._steady = None
        prefill_room = self._prefill_room()
        budget = _Budget(cfg.max_num_batched_tokens, prefill_room, cfg.max_num_seqs)
        live = sorted((r for r in self.running if not r.phase.terminal), key=self._key)
        decodes = [r for r in live if r.phase is Phase.DECODE]
        if self._run_decodes_together(decodes, budget):
            decodes = []
        for req in decodes + [r for r in live if r.phase is not Phase.DECODE]:
            if req.phase.terminal or _preempted_at(req, iteration):
                continue  # preempted earlier in this pass
            if req.phase in (Phase.WAITING, Phase.PREEMPTED):  # static members waiting inside their batch
                self._try_start(req, budget, iteration)
            else:
                self._run_member(req, budget, live, iteration)
        if cfg.mode is Mode.STATIC:
            if not self.running:
                self._form_static_batch(budget, iteration)
            elif budget.limit is Limit.QUEUE_EMPTY:
                budget.limit = Limit.STATIC_BATCH
        elif self._counts["preempted"]:
            budget.limit = Limit.KV_BLOCKS  # admitting now would take the blocks just reclaimed
        else:
            self._admit(budget, iteration)
        return self._decision(iteration, budget)

    def _run_decodes_together(self, decodes: list[Request], budget: _Budget) -> bool:
        """Give every decode its token at once when budget and blocks suffice (no one to preempt).

        Same outcome as the one-by-one path below (same order, same blocks), at a fraction of the cost;
        when anything is short, returns False and the one-by-one path decides who yields.
        """
        if not decodes or len(decodes) > budget.tokens or self.config.preemption is PreemptKind.REJECT:
            return False
        bs = self.blocks.block_size
        grow = [r for r in decodes if r.num_computed >= len(r.block_ids) * bs]
        if len(grow) > self.blocks.device.num_free:
            return False
        for req in grow:
            self.blocks.grow(req, 1)
        budget.work.extend((r, 1) for r in decodes)
        budget.tokens -= len(decodes)
        budget.prefill_cap = min(budget.prefill_cap, budget.tokens)
        if budget.tokens == 0:
            budget.limit = Limit.TOKEN_BUDGET
        return True

    def _run_member(self, req: Request, budget: _Budget, live: list[Request], iteration: int) -> None:
        """Give a running request its tokens, preempting lower-ranked members for KV blocks."""
        n = self._chunk(req, budget)
        if n == 0:
            return
        while not self.blocks.can_grow(req, n):
            victim = self._victim(live, budget, req)
            self._preempt(victim, iteration)
            if victim is req:
                return
        self._take(req, n, budget, iteration)

    def _admit(self, budget: _Budget, iteration: int) -> None:
        """Continuous mode: fill free slots from the queue in policy order."""
        while (req := self.waiting.peek()) is not None:
            if len(self.running) >= budget.seqs:
                budget.limit = Limit.SEQ_BUDGET
                return
            if not self._try_start(req, budget, iteration):
                if req.phase is Phase.REJECTED:
                    continue  # preemption mode "reject" refused it; the next one may fit
                return
            self.running.append(self.waiting.pop())
        budget.limit = Limit.QUEUE_EMPTY

    def _form_static_batch(self, budget: _Budget, iteration: int) -> None:
        """Static mode: no batch is running; take up to `max_num_seqs` requests in policy order.

        Like a static-batching server, the batch preallocates each member's KV for its whole length
        (prompt + max_tokens), so members never wait for blocks or get preempted mid-batch.
        """
        while (req := self.waiting.peek()) is not None and len(self.running) < budget.seqs:
            need = self._worst_blocks(req)
            if need > self.blocks.device.num_free:
                budget.limit = Limit.KV_BLOCKS
                break
            self.blocks.grow_to(req, need)
            self.running.append(self.waiting.pop())
        else:
            budget.limit = Limit.SEQ_BUDGET if self.waiting else Limit.QUEUE_EMPTY
        for req in self.running:
            self._try_start(req, budget, iteration)

    def _try_start(self, req: Request, budget: _Budget, iteration: int) -> bool:
        """Admit or resume a request into this iteration if the budgets and blocks allow."""
        n = self._chunk(req, budget)
        if n == 0:
            return False
        if self.config.preemption is PreemptKind.REJECT and req.request_id not in self._reserved:
            if not self._reserve(req, iteration):
                return False
        if self.blocks.blocks_needed(req, n) > self.blocks.device.num_free - self._kv_promised(req):
            budget.limit = Limit.KV_BLOCKS
            return False
        resumed = req.phase is Phase.PREEMPTED
        if req.swap_slots:
            self._swap.swap_in.extend(self.blocks.swap_in(req))
        phase = Phase.DECODE if req.tokens_left_to_compute == 1 and req.output_ids else Phase.PREFILL
        req.move(phase, Reason.RESUMED if resumed else Reason.ADMITTED, iteration)
        if req.first_scheduled_iteration is None:
            req.first_scheduled_iteration = iteration
        self._counts["resumed" if resumed else "admitted"] += 1
        kind = EventKind.RESUME if resumed else EventKind.ADMIT
        self.events.append(Event(req.request_id, iteration, kind, req.transitions[-1].reason))
        self._take(req, n, budget, iteration)
        return True

    def _chunk(self, req: Request, budget: _Budget) -> int:
        """Tokens the request may run now under the token budget (0: not this iteration)."""
        want = req.tokens_left_to_compute
        is_decode = want == 1 and bool(req.output_ids)
        room = budget.tokens if is_decode else budget.prefill_cap
        if want <= room:
            return want
        # A recompute can outgrow a prompt that fit: it is chunked even when chunked prefill is off.
        if (self.config.chunked_prefill or req.num_preemptions) and room > 0:
            return room
        budget.limit = Limit.DECODE_RESERVE if room < budget.tokens and want <= budget.tokens else Limit.TOKEN_BUDGET
        return 0

    def _take(self, req: Request, n: int, budget: _Budget, iteration: int) -> None:
        """Spend budget and blocks on `n` of the request's tokens."""
        self.blocks.grow(req, n)
        if req.request_id in self._reserved:
            self._reserved[req.request_id] = max(0, self._worst_blocks(req) - len(req.block_ids))
        budget.tokens -= n
        if req.phase is Phase.DECODE:  # decode spends the reservation first
            budget.prefill_cap = min(budget.prefill_cap, budget.tokens)
        else:
            budget.prefill_cap -= n
            self.events.append(Event(req.request_id, iteration, EventKind.PREFILL_CHUNK, tokens=n))
        budget.work.append((req, n))
        if budget.tokens == 0:
            budget.limit = Limit.TOKEN_BUDGET

    def _victim(self, live: list[Request], budget: _Budget, needy: Request) -> Request:
        """The lowest-ranked live request holding blocks and not yet scheduled (the needy one if none)."""
        scheduled = {r.request_id for r, _ in budget.work}
        for req in reversed(live):
            if req is not needy and req.phase.running and req.block_ids and req.request_id not in scheduled:
                return req
        return needy

    def _preempt(self, req: Request, iteration: int) -> None:
        """Take a running request's blocks away: swap them out, or drop them to recompute later."""
        if self.config.preemption is PreemptKind.SWAP and len(req.block_ids) <= self.blocks.swap.num_free:
            self._swap.swap_out.extend(self.blocks.swap_out(req))
        else:
            self.blocks.free(req)
            req.num_computed = 0
        req.move(Phase.PREEMPTED, Reason.KV_EXHAUSTED, iteration)
        req.num_preemptions += 1
        req.enqueued_iteration = iteration
        self._counts["preempted"] += 1
        self.events.append(Event(req.request_id, iteration, EventKind.PREEMPT, Reason.KV_EXHAUSTED))
        if self.config.mode is Mode.CONTINUOUS:
            self.running.remove(req)
            self.waiting.push(req)

    def _reject(self, req: Request, reason: Reason, iteration: int) -> None:
        req.move(Phase.REJECTED, reason, iteration)
        self._counts["rejected"] += 1
        self.events.append(Event(req.request_id, iteration, EventKind.REJECT, reason))
        self.waiting.remove(req)

    # ---- preemption mode "reject": worst-case reservations ------------------------------------------
    def _worst_blocks(self, req: Request) -> int:
        return self.blocks.blocks_for(len(req.prompt_ids) + req.sampling.max_tokens)

    def _kv_promised(self, exclude: Request | None = None) -> int:
        skip = exclude.request_id if exclude is not None else None
        return sum(n for rid, n in self._reserved.items() if rid != skip)

    def _reserve(self, req: Request, iteration: int) -> bool:
        """Promise the request its worst-case blocks, or reject it: it never waits for KV."""
        need = self._worst_blocks(req) - len(req.block_ids)
        if need > self.blocks.device.num_free - self._kv_promised():
            self._reject(req, Reason.NO_KV_FOR_ADMISSION, iteration)
            return False
        self._reserved[req.request_id] = need
        return True

    # ---- after the forward pass --------------------------------------------------------------------
    def postprocess(self, decision: Decision, tokens: dict[int, int], iteration: int) -> list[Request]:
        """Commit the iteration: cached tokens, sampled tokens, stops. Returns requests that finished."""
        finished = []
        changed = False  # a phase change or finish ends any steady decode batch
        for req, n in decision.work:
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk that did not reach the end: nothing sampled
            token = tokens[req.request_id]
            req.output_ids.append(token)
            first = len(req.output_ids) == 1
            self.events.append(Event(req.request_id, iteration, EventKind.FIRST_TOKEN if first else EventKind.TOKEN, tokens=1))
            sp = req.sampling
            if token in sp.stop_token_ids and not sp.ignore_eos:
                self._finish(req, Phase.FINISHED_STOP, Reason.STOP_TOKEN, iteration)
            elif len(req.output_ids) >= sp.max_tokens:
                self._finish(req, Phase.FINISHED_LENGTH, Reason.MAX_TOKENS, iteration)
            elif req.phase is Phase.PREFILL:
                req.move(Phase.DECODE, Reason.PROMPT_DONE, iteration)
                changed = True
            if req.phase.terminal:
                finished.append(req)
                changed = True
        self._track_steady(decision, tokens, changed)
        return finished

    def _track_steady(self, decision: Decision, tokens: dict[int, int], changed: bool) -> None:
        """Keep (or start) the steady-decode batch when this iteration was all decode and changed nothing."""
        cfg = self.config
        steady_now = (not changed and cfg.mode is Mode.CONTINUOUS and not decision.preempted
                      and cfg.preemption is not PreemptKind.REJECT  # its reservations are kept per step
                      and decision.prefill_tokens == 0 and decision.decode_tokens == len(self.running) > 0)
        if not steady_now:
            self._steady = None
            return
        if self._steady is None or decision.work is not self._steady.work:
            self._steady = SteadyDecode(decision.batch, decision.work, decision.member_ids)
        ids = self._steady.request_ids.tolist()
        self._steady.advance(np.fromiter((tokens[i] for i in ids), dtype=np.int64, count=len(ids)))

    def _finish(self, req: Request, phase: Phase, reason: Reason, iteration: int) -> None:
        req.move(phase, reason, iteration)
        self._reserved.pop(req.request_id, None)
        self.events.append(Event(req.request_id, iteration, EventKind.FINISH, reason))
        if self.config.mode is Mode.CONTINUOUS:
            self.blocks.free(req)
            self.running.remove(req)
        else:  # static members keep their slot and blocks until the whole batch is done
            self._end_static_batch_if_done()

    def _end_static_batch_if_done(self) -> None:
        if all(r.phase.terminal for r in self.running):
            for req in self.running:
                self.blocks.free(req)
            self.running = []

    # ---- helpers -------------------------------------------------------------------------------------
    def _prefill_room(self) -> int:
        """Tokens per iteration that prefill may use: the budget less the decode reservation."""
        cfg = self.config
        return cfg.max_num_batched_tokens - int(cfg.decode_reserve * cfg.max_num_batched_tokens)

    def _decision(self, iteration: int, budget: _Budget) -> Decision:
        work = budget.work
        scheduled = {r.request_id for r, _ in work}
        members = [r.request_id for r in self.running]
        finished = [r.request_id for r in self.running if r.phase.terminal]
        stalled = [r.request_id for r in self.running if not r.phase.terminal and r.request_id not in scheduled]
        decode = sum(n for r, n in work if r.phase is Phase.DECODE)
        return self._emit(Decision(
            iteration=iteration,
            work=work,
            batch=build_batch(iteration, work, self.blocks.block_size),
            swap=self._swap,
            member_ids=members,
            finished_member_ids=finished,
            stalled_member_ids=stalled,
            limit=budget.limit,
            prefill_tokens=sum(n for _, n in work) - decode,
            decode_tokens=decode,
        ))

    def _steady_decision(self, iteration: int) -> Decision | None:
        """Repeat the last all-decode batch if nothing could change it; None sends us the general way."""
        steady, cfg = self._steady, self.config
        queue_open = bool(self.waiting) and len(self.running) < cfg.max_num_seqs
        if queue_open or len(steady.reqs) > cfg.max_num_batched_tokens:
            return None
        batch = steady.next_batch(iteration, self.blocks)
        if batch is None:
            return None
        return self._emit(Decision(
            iteration=iteration, work=steady.work, batch=batch, swap=self._swap, member_ids=steady.member_ids,
            finished_member_ids=[], stalled_member_ids=[],
            limit=Limit.SEQ_BUDGET if self.waiting else Limit.QUEUE_EMPTY,
            prefill_tokens=0, decode_tokens=len(steady.reqs),
        ))

    def _emit(self, decision: Decision) -> Decision:
        """Attach the counts gathered since the last decision, and reset them."""
        for name, value in self._counts.items():
            setattr(decision, name, value)
        self._counts = _zero_counts()
        return decision
