"""The iteration-level scheduler: at each iteration boundary, pick the batch. Imports no torch.

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

from dataclasses import dataclass, field

import numpy as np

from itertrace.profiler.batch import SwapPlan
from itertrace.profiler.batch_builder import DecodeRows, build_batch
from itertrace.profiler.decision import Decision, Event, EventKind, Limit, Mode, SchedulerConfig, TokenEvents
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.policies import WaitQueue, sort_key
from itertrace.profiler.preemption import make_room
from itertrace.profiler.request import Phase, PreemptKind, Reason, Request

__all__ = ["Decision", "Event", "EventKind", "Limit", "Mode", "Scheduler", "SchedulerConfig", "TokenEvents"]


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
        self._member_ids: list[int] | None = None  # ids of self.running, until it changes
        self.events: list[Event | TokenEvents] = []  # drained by the engine after each call
        self._reserved: dict[int, int] = {}  # preemption mode "reject": blocks promised per request
        self._swap = SwapPlan()
        self._counts = _zero_counts()  # since the last decision
        self._rows: DecodeRows | None = None  # the running decodes as arrays (None: rebuild)
        self._rows_run = 0  # how many leading rows of the last decision came from self._rows

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
        self._rows = None  # rebuilt from the requests at the next schedule
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
                self._leave(req)
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
        budget = _Budget(cfg.max_num_batched_tokens, self._prefill_room(), cfg.max_num_seqs)
        rows = self._decode_rows()
        if len(rows) > budget.tokens:  # each decode joined with a token of its own iteration's budget
            raise RuntimeError(f"iteration {iteration}: {len(rows)} running decodes exceed the token budget")
        # members that are not decoding (prefills; static members waiting to start), in slot order
        others = ([r for r in self.running if r.phase is not Phase.DECODE and not r.phase.terminal]
                  if len(self.running) > len(rows) else [])  # every running decode has a row
        live = sorted(others, key=self._key)
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
        elif self._counts["preempted"]:
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

    def _run_rows(self, rows: DecodeRows, live: list[Request], budget: _Budget, iteration: int) -> None:
        """Give every decode row its token; rows that need a block take one in policy order (see make_room)."""
        if not len(rows):
            return
        grow = rows.growing().tolist()
        yielded: list[int] = []
        if len(grow) > self.blocks.device.num_free:
            preempt = lambda req: self._preempt(req, iteration)  # noqa: E731
            grow, yielded = make_room(rows, live, grow, self.blocks, self._key, preempt)
        if grow:
            rows.grow(grow, self.blocks)
            if self._reserved:
                for i in grow:
                    self._update_reservation(rows.reqs[i])
        if yielded:
            rows.leave(yielded)
            rows.merge()
        budget.tokens -= len(rows)
        if len(rows):
            budget.prefill_cap = min(budget.prefill_cap, budget.tokens)
        if budget.tokens == 0:
            budget.limit = Limit.TOKEN_BUDGET

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
            self._enter(self.waiting.pop())
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
            self._enter(self.waiting.pop())
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
        self._update_reservation(req)
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
            self._leave(req)
            self.waiting.push(req)

    def _reject(self, req: Request, reason: Reason, iteration: int) -> None:
        req.move(Phase.REJECTED, reason, iteration)
        self._counts["rejected"] += 1
        self.events.append(Event(req.request_id, iteration, EventKind.REJECT, reason))
        self.waiting.remove(req)

    # ---- preemption mode "reject": worst-case reservations ------------------------------------------
    def _worst_blocks(self, req: Request) -> int:
        return self.blocks.blocks_for(len(req.prompt_ids) + req.sampling.max_tokens)

    def _update_reservation(self, req: Request) -> None:
        """What is still promised to a request with reserved blocks: its worst case less what it holds."""
        if req.request_id in self._reserved:
            self._reserved[req.request_id] = max(0, self._worst_blocks(req) - len(req.block_ids))

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
    def postprocess(self, decision: Decision, tokens: np.ndarray, iteration: int) -> list[Request]:
        """Commit the iteration: cached tokens, sampled tokens, stops. Returns requests that finished.

        `tokens` holds one token per sampled row, in batch order. Token events go out as TokenEvents
        blocks, each finish right after its request's token, in batch order.
        """
        batch = decision.batch
        ids = batch.sampled_ids
        if len(tokens) != len(ids):
            raise ValueError(f"iteration {iteration}: {len(tokens)} tokens for {len(ids)} sampled sequences")
        first = batch.num_generated[batch.sample] == 0
        rows, n_rows = self._rows, self._rows_run
        self._rows_run = 0
        finished, emitted = [], 0
        if n_rows:  # the decode rows: every one sampled a token
            row_tokens = tokens[:n_rows]
            for req, token in zip(rows.reqs, row_tokens.tolist()):
                req.num_computed += 1
                req.output_ids.append(token)
            ended = []
            for i in rows.may_stop(row_tokens):
                req = rows.reqs[i]
                stop = self._stop(req, req.output_ids[-1])
                if stop is not None:
                    emitted = self._token_events(ids, first, emitted, i + 1, iteration)
                    self._finish(req, *stop, iteration)
                    finished.append(req)
                    ended.append(i)
            rows.advance(row_tokens)
            rows.leave(ended)
        sampled = n_rows
        for req, n in decision.work[n_rows:]:
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk that did not reach the end: nothing sampled
            req.output_ids.append(int(tokens[sampled]))
            sampled += 1
            stop = self._stop(req, req.output_ids[-1])
            if stop is not None:
                emitted = self._token_events(ids, first, emitted, sampled, iteration)
                self._finish(req, *stop, iteration)
                finished.append(req)
            elif req.phase is Phase.PREFILL:
                req.move(Phase.DECODE, Reason.PROMPT_DONE, iteration)
            if rows is not None and req.phase is Phase.DECODE:
                rows.join(req)
        self._token_events(ids, first, emitted, len(ids), iteration)
        return finished

    def _token_events(self, ids: np.ndarray, first: np.ndarray, start: int, stop: int, iteration: int) -> int:
        """Emit the token events of sampled rows [start, stop); returns stop."""
        if stop > start:
            self.events.append(TokenEvents(iteration, ids[start:stop], first[start:stop]))
        return stop

    @staticmethod
    def _stop(req: Request, token: int) -> tuple[Phase, Reason] | None:
        """Whether the token just sampled ends the request, and how."""
        sp = req.sampling
        if token in sp.stop_token_ids and not sp.ignore_eos:
            return Phase.FINISHED_STOP, Reason.STOP_TOKEN
        if len(req.output_ids) >= sp.max_tokens:
            return Phase.FINISHED_LENGTH, Reason.MAX_TOKENS
        return None

    def _finish(self, req: Request, phase: Phase, reason: Reason, iteration: int) -> None:
        req.move(phase, reason, iteration)
        self._reserved.pop(req.request_id, None)
        self.events.append(Event(req.request_id, iteration, EventKind.FINISH, reason))
        if self.config.mode is Mode.CONTINUOUS:
            self.blocks.free(req)
            self._leave(req)
        else:  # static members keep their slot and blocks until the whole batch is done
            self._end_static_batch_if_done()

    def _end_static_batch_if_done(self) -> None:
        if all(r.phase.terminal for r in self.running):
            for req in self.running:
                self.blocks.free(req)
            self.running, self._member_ids = [], None

    # ---- helpers -------------------------------------------------------------------------------------
    def _enter(self, req: Request) -> None:
        self.running.append(req)
        self._member_ids = None

    def _leave(self, req: Request) -> None:
        self.running.remove(req)
        self._member_ids = None

    def _members(self) -> list[int]:
        """Ids of the requests holding slots, in slot order (one list, shared until membership changes)."""
        if self._member_ids is None:
            self._member_ids = [r.request_id for r in self.running]
        return self._member_ids

    def _prefill_room(self) -> int:
        """Tokens per iteration that prefill may use: the budget less the decode reservation."""
        cfg = self.config
        return cfg.max_num_batched_tokens - int(cfg.decode_reserve * cfg.max_num_batched_tokens)

    def _decision(self, iteration: int, rows: DecodeRows, budget: _Budget) -> Decision:
        """The decode rows, then the work taken one by one (prefills, admissions), as one batch."""
        work = budget.work
        batch = build_batch(rows.batch(iteration), work) if work else rows.batch(iteration)
        stalled = []
        if len(self.running) > len(rows) + len(work):  # someone holding a slot ran nothing
            scheduled = {r.request_id for r, _ in work}
            stalled = [r.request_id for r in self.running if not r.phase.terminal
                       and r.phase is not Phase.DECODE and r.request_id not in scheduled]
        decode = len(rows) + sum(n for r, n in work if r.phase is Phase.DECODE)
        self._rows_run = len(rows)
        return self._emit(Decision(
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
        ))

    def _emit(self, decision: Decision) -> Decision:
        """Attach the counts gathered since the last decision, and reset them."""
        for name, value in self._counts.items():
            setattr(decision, name, value)
        self._counts = _zero_counts()
        return decision
