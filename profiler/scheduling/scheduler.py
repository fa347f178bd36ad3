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

Static and continuous batching share this one class. They differ in four small places: how the
batch fills (`_form_static_batch`, `_admit`), what a finish releases (a continuous request's slot and
blocks at once, a static member's only with its whole batch), where a preempted request waits (the
queue, or its static batch), and which members count as finished. Everything else is shared: the
queue, the passes, the decode rows, preemption, admission, iterations in bulk. Two subclasses would
each override those places with a line or two and split the one pass both run across a base class;
one class with four `mode` branches reads straight through.

This module holds the scheduler's state, its calls and the passes of each iteration. Beside it:
`budget` (the token budget), `admission` (a request's KV on starting, preemption, rejection),
`preemption` (who yields), `batch_builder` (the batch's arrays) and `postprocess` (sampled tokens).
"""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.admission import Admission
from itertrace.profiler.scheduling.batch import Placeholders, SwapPlan
from itertrace.profiler.scheduling.batch_builder import DecodeRows, build_batch
from itertrace.profiler.scheduling.budget import Budget, prefill_room
from itertrace.profiler.scheduling.decision import Decision, Event, EventKind, Limit, Mode, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import WaitQueue, sort_key
from itertrace.profiler.scheduling.postprocess import commit_sampled, commit_tokens
from itertrace.profiler.scheduling.preemption import make_room, victim
from itertrace.profiler.scheduling.stretch import Chunk, chunk_steps, commit_stretch, repeated_chunk
from itertrace.profiler.scheduling.request import Phase, PreemptKind, Reason, Request

__all__ = ["Decision", "Event", "EventKind", "Limit", "Mode", "Scheduler", "SchedulerConfig", "TokenEvents"]


def _check_tokens(decision: Decision, tokens: np.ndarray, iteration: int) -> None:
    """One token per sampled row, or an error."""
    if len(tokens) != len(decision.batch.sampled_ids):
        raise ValueError(f"iteration {iteration}: {len(tokens)} tokens for {len(decision.batch.sampled_ids)} "
                         "sampled sequences")


def _preempted_at(req: Request, iteration: int) -> bool:
    return req.phase is Phase.PREEMPTED and req.transitions[-1].iteration == iteration


class Scheduler:
    """Holds the queue and the batch; `schedule` and `postprocess` bracket every forward pass."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._key = sort_key(config.policy, config.aging_iterations)
        self.waiting = WaitQueue(self._key)  # new requests, and preempted ones in continuous mode
        self.running: list[Request] = []  # requests holding a slot (static: every member of the batch)
        self._running_ids: list[int] = []  # ids of self.running, kept in step with it
        self._member_ids: list[int] | None = None  # a copy of _running_ids handed out, until it changes
        self.events: list[Event | TokenEvents] = []  # drained by the engine after each call
        self._admission = Admission(config, blocks, self.waiting, self.events)
        self._swap = SwapPlan()
        self._rows: DecodeRows | None = None  # the running decodes as arrays (None: rebuild)
        self._rows_run = 0  # how many leading rows of the last decision came from self._rows
        self._chunk: Chunk | None = None  # the prompt chunk the stretch that bulk_steps counted repeats
        self._prefill_room = prefill_room(config)
        # False (set by the engine for a runner that never reads token ids): prefill chunks carry -1
        # for their tokens, so a synthetic prompt is never made (see tokenizer.SynthPrompt)
        self.read_tokens = True

    # ---- requests coming and going -------------------------------------------------------------
    def add(self, req: Request, iteration: int) -> None:
        """A request arrives; one that can never fit is rejected at once."""
        self.events.append(Event(req.request_id, iteration, EventKind.ARRIVE, Reason.ARRIVED))
        req.enqueued_iteration = iteration
        if self._admission.never_fits(req):
            self._admission.reject(req, Reason.TOO_LONG, iteration)
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
        self._admission.release(request_id)
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

    # ---- after the forward pass --------------------------------------------------------------------
    def postprocess(self, decision: Decision, tokens: np.ndarray, iteration: int) -> list[Request]:
        """Commit the iteration: cached tokens, sampled tokens, stops. Returns requests that finished.

        `tokens` holds one token per sampled row, in batch order (see postprocess.commit_tokens).
        """
        _check_tokens(decision, tokens, iteration)
        return self._commit(decision, tokens, iteration, self.events)

    def _commit(self, decision: Decision, tokens: np.ndarray, iteration: int,
                events: list[Event | TokenEvents]) -> list[Request]:
        """postprocess.commit_tokens on the decision's rows, the decode rows first."""
        n_rows, self._rows_run = self._rows_run, 0
        return commit_tokens(decision, tokens, iteration, self._rows, n_rows, events, self._finish)

    # ---- iterations in bulk (see stretch.py) ------------------------------------------------------------
    def bulk_steps(self, decision: Decision) -> int:
        """How many iterations, `decision` (just scheduled, not yet run) first, repeat it (the decode rows, and at
        most one prompt chunk of the same size) before a row samples its last token (max_tokens) or the chunk
        reaches its end; 0 when `decision` runs anything else.

        Such iterations schedule the same rows, each one position further, the same chunk (its request started
        in the first at most), with the same limit, until a row finishes, a request arrives or is canceled, or
        the pool runs short: nothing else moves. A queued request that could not start now cannot start then either: the token budget left to
        it is the same, and the free blocks (less those promised to others, in preemption mode "reject") only
        shrink as the rows grow. In static mode every live member must be a decode row.
        """
        rows, self._chunk = self._rows, None
        if (rows is None or not len(rows) or decision.stalled_member_ids
                or decision.swap.swap_out or decision.swap.swap_in or decision.preempted or decision.rejected
                or len(self.running) - len(decision.finished_member_ids) != len(decision.work)):
            return 0
        if decision.batch.num_seqs == len(rows) and not decision.prefill_tokens and not self.events:
            return rows.steps_to_finish()  # (and so nothing was admitted or resumed)
        self._chunk = repeated_chunk(decision, rows, self.events, self.config)
        return min(rows.steps_to_finish(), chunk_steps(self._chunk)) if self._chunk else 0

    def commit_bulk(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Commit at once the leading iterations of `tokens` ([steps, D]: the decode rows' tokens in iterations
        that `bulk_steps` counted, the one just scheduled first) up to the first where a row may stop on a
        stop token or the pool lacks a block (it runs as usual: it preempts). Returns [n] KV blocks allocated
        and [n] in use in each of the n iterations committed; None when n would be 0."""
        done = commit_stretch(self._rows, self._chunk, self.blocks, tokens)
        if done is None:
            return None
        allocated, in_use, grew = done
        if self._admission.reserved:
            for req in grew:
                self._admission.update(req)
        self._rows_run = 0  # as postprocess leaves it
        return allocated, in_use

    # ---- overlap mode: an iteration committed ahead of its tokens ---------------------------------------
    def commit_ahead(self, decision: Decision) -> None:
        """Overlap mode: commit an iteration just scheduled as if its tokens were in, each a placeholder
        (batch.Placeholders), so that the next iteration can be scheduled while this one runs; and hold its
        requests' blocks (BlockManager.hold) until the device is done with it (`device_done`). A request
        reaching max_tokens finishes here, announced when its last token comes (its events wait for
        `commit_sampled`); a stop token can only be seen then.
        """
        self.blocks.hold(decision.batch.request_ids)
        self._commit(decision, Placeholders.tokens(len(decision.batch.sampled_ids)), decision.iteration, [])

    def device_done(self) -> None:
        """Overlap mode: the device finished the oldest iteration committed ahead; the blocks held for it go back."""
        self.blocks.release_held()

    def commit_sampled(self, decision: Decision, tokens: np.ndarray) -> tuple[list[Request], np.ndarray]:
        """Overlap mode: the tokens of an iteration committed ahead (see postprocess.commit_sampled). Returns the
        requests that finished and [sampled] bool: the rows whose token counts."""
        _check_tokens(decision, tokens, decision.iteration)
        return commit_sampled(decision, tokens, self.events, self._finish_late)

    def _finish_late(self, req: Request, phase: Phase, reason: Reason, iteration: int) -> None:
        """A stop token seen after later iterations were scheduled: the request's row (if any) leaves when the
        rows are rebuilt, and its blocks when the device is done with them (BlockManager.hold)."""
        self._rows = None
        self._finish(req, phase, reason, iteration)

    def _finish(self, req: Request, phase: Phase, reason: Reason, iteration: int) -> None:
        """A request reached a terminal state: what it held goes (its FINISH event is postprocess's)."""
        queued = req.phase is Phase.PREEMPTED and self.config.mode is Mode.CONTINUOUS  # overlap: see commit_sampled
        req.move(phase, reason, iteration)
        self._admission.release(req.request_id)
        if self.config.mode is Mode.CONTINUOUS:
            self.blocks.free(req)
            if queued:
                self.waiting.remove(req)
            else:
                self._leave(req)
        else:  # static members keep their slot and blocks until the whole batch is done
            self._end_static_batch_if_done()

    def _end_static_batch_if_done(self) -> None:
        if all(r.phase.terminal for r in self.running):
            for req in self.running:
                self.blocks.free(req)
            self.running, self._running_ids, self._member_ids = [], [], None

    # ---- helpers -------------------------------------------------------------------------------------
    def _enter(self, req: Request) -> None:
        self.running.append(req)
        self._running_ids.append(req.request_id)
        self._member_ids = None

    def _leave(self, req: Request) -> None:
        i = self.running.index(req)  # by identity (Request compares by identity)
        del self.running[i], self._running_ids[i]
        self._member_ids = None

    def _members(self) -> list[int]:
        """Ids of the requests holding slots, in slot order (one list, shared until membership changes)."""
        if self._member_ids is None:
            self._member_ids = self._running_ids.copy()
        return self._member_ids

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
