"""The iteration-level scheduler: its state, requests coming and going, and its calls. Imports no torch.

Notes
-----
Static and continuous batching share this one class. They differ in four small places: how the
batch fills (`_form_static_batch`, `_admit`), what a finish releases (a continuous request's slot and
blocks at once, a static member's only with its whole batch), where a preempted request waits (the
queue, or its static batch), and which members count as finished. Everything else is shared: the
queue, the passes, the decode rows, preemption, admission, iterations in bulk. Two subclasses would
each override those places with a line or two and split the one pass both run across a base class;
one class with four `mode` branches reads straight through.

This module holds the scheduler's state, arrivals, cancels, finishes and `postprocess`. Its other
calls live beside it, one responsibility each: `passes` (`schedule`: the passes of each iteration)
and `commit_modes` (iterations committed in bulk, or ahead of their tokens in overlap mode). Below
them: `budget` (the token budget), `admission` (a request's KV on starting, preemption, rejection),
`preemption` (who yields), `batch_builder` (the batch's arrays), `stretch` (iterations in bulk),
`thrash` (a long prompt's preempt-and-resume cycles in a full pool, as one chain) and `postprocess`
(sampled tokens).
"""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.admission import Admission
from itertrace.profiler.scheduling.batch import SwapPlan
from itertrace.profiler.scheduling.batch_builder import DecodeRows
from itertrace.profiler.scheduling.budget import prefill_room
from itertrace.profiler.scheduling.commit_modes import CommitAhead, InBulk
from itertrace.profiler.scheduling.decision import Decision, Event, EventKind, Limit, Mode, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.passes import SchedulePasses
from itertrace.profiler.scheduling.policies import WaitQueue, sort_key
from itertrace.profiler.scheduling.postprocess import check_tokens, commit_tokens
from itertrace.profiler.scheduling.request import Phase, Reason, Request
from itertrace.profiler.scheduling.stretch import Chunk

__all__ = ["Decision", "Event", "EventKind", "Limit", "Mode", "Scheduler", "SchedulerConfig", "TokenEvents"]


class Scheduler(SchedulePasses, InBulk, CommitAhead):
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
        self._thrash: Chunk | None = None  # the last chunk that preempted itself (commit_modes.preempt_chunk)
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

    # ---- after the forward pass --------------------------------------------------------------------
    def postprocess(self, decision: Decision, tokens: np.ndarray, iteration: int) -> list[Request]:
        """Commit the iteration: cached tokens, sampled tokens, stops. Returns requests that finished.

        `tokens` holds one token per sampled row, in batch order (see postprocess.commit_tokens).
        """
        check_tokens(decision, tokens, iteration)
        return self._commit(decision, tokens, iteration, self.events)

    def _commit(self, decision: Decision, tokens: np.ndarray, iteration: int,
                events: list[Event | TokenEvents]) -> list[Request]:
        """postprocess.commit_tokens on the decision's rows, the decode rows first."""
        n_rows, self._rows_run = self._rows_run, 0
        return commit_tokens(decision, tokens, iteration, self._rows, n_rows, events, self._finish)

    # ---- a request's end ----------------------------------------------------------------------------
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

    # ---- slots -------------------------------------------------------------------------------------
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

