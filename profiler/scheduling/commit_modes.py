"""The scheduler's two other ways of committing iterations: many at once, and one ahead of its tokens.

In bulk (profiler/bulk.py), the engine asks `bulk_steps` how many iterations repeat the one just
scheduled, runs them in one call, and hands their tokens to `commit_bulk` (the stretch itself is
stretch.py's). In overlap mode (profiler/overlap.py), `commit_ahead` commits an iteration before its
tokens exist, so that the next can be scheduled while it runs, and `commit_sampled` takes them when
they come.
"""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.admission import Admission
from itertrace.profiler.scheduling.batch import Placeholders, SwapPlan
from itertrace.profiler.scheduling.batch_builder import DecodeRows
from itertrace.profiler.scheduling.budget import Budget
from itertrace.profiler.scheduling.decision import Decision, Event, Limit, SchedulerConfig, TokenEvents
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.postprocess import check_tokens, commit_decode_steps, commit_sampled
from itertrace.profiler.scheduling.request import Phase, PreemptKind, Reason, Request
from itertrace.profiler.scheduling.stretch import Chunk, chunk_steps, commit_stretch, repeated_chunk


class InBulk:
    """The part of `Scheduler` that commits iterations in bulk; the state is scheduler.py's."""

    config: SchedulerConfig
    blocks: BlockManager
    running: list[Request]
    events: list[Event | TokenEvents]
    _admission: Admission
    _rows: DecodeRows | None
    _rows_run: int
    _chunk: Chunk | None  # the stretch's chunk; after commit_bulk, only where the pool ran short
    _prefill_room: int
    _swap: SwapPlan
    _thrash: Chunk | None  # the last chunk that preempted itself, and its size (scheduling/thrash.py)

    def bulk_steps(self, decision: Decision) -> int:
        """How many iterations, `decision` (just scheduled, not yet run) first, repeat it (the decode rows, and at
        most one prompt chunk of the same size) before a row samples its last token (max_tokens) or the chunk
        reaches its end; 0 when `decision` runs anything else.

        Such iterations schedule the same rows, each one position further, the same chunk (its request started
        in the first at most), with the same limit, until a row finishes, a request arrives or is canceled, or
        the pool runs short: nothing else moves. A queued request that could not start now cannot start then
        either: the token budget left to it is the same, and the free blocks (less those promised to others, in
        preemption mode "reject") only shrink as the rows grow. In static mode every live member must be a
        decode row.
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
        allocated, in_use, grew, short = done
        if not short:
            self._chunk = None
        if self._admission.reserved:
            for req in grew:
                self._admission.update(req)
        self._rows_run = 0  # as postprocess leaves it
        return allocated, in_use

    def preempts_chunk(self) -> bool:
        """Whether the iteration after a stretch that `commit_bulk` stopped where the pool ran short runs the
        decode rows alone, the chunk's request preempting itself (recompute): the rows' blocks fit the pool,
        the chunk's next blocks do not, and its request is the only other running one, so its own victim."""
        chunk, rows, cfg = self._chunk, self._rows, self.config
        if chunk is None or cfg.preemption is not PreemptKind.RECOMPUTE or len(self.running) != len(rows) + 1:
            return False
        budget = Budget(cfg.max_num_batched_tokens - len(rows), self._prefill_room, cfg.max_num_seqs)
        budget.prefill_cap = min(budget.prefill_cap, budget.tokens)  # as _run_rows leaves it
        n = budget.chunk(chunk[0], cfg.chunked_prefill)
        free = self.blocks.device.num_free - len(rows.growing())
        return n > 0 and free >= 0 and self.blocks.blocks_needed(chunk[0], n) > free

    def preempt_chunk(self, iteration: int, tokens: np.ndarray) -> Decision:
        """The iteration `preempts_chunk` foresaw, scheduled and committed (`tokens`: [D] the rows') as `schedule`
        and `postprocess` would: the rows take their blocks, the chunk's request yields its own and queues again.
        Its events but the tokens' are the scheduler's."""
        rows, (req, _) = self._rows, self._chunk
        self._thrash, self._chunk = self._chunk, None
        self.blocks.reset_counters()
        self._swap = SwapPlan()
        grow = rows.growing()
        if len(grow):
            rows.grow(grow, self.blocks)
        self._preempt(req, iteration)
        counts = self._admission.counts
        decision = Decision(iteration=iteration, work=rows.work(), batch=rows.batch(iteration), swap=self._swap,
                            member_ids=self._members(), finished_member_ids=[], stalled_member_ids=[],
                            limit=Limit.KV_BLOCKS, prefill_tokens=0, decode_tokens=len(rows), **counts)
        for name in counts:
            counts[name] = 0
        commit_decode_steps(rows, tokens[None])
        return decision


class CommitAhead:
    """The part of `Scheduler` that commits overlap mode's iterations ahead of their tokens (with its
    `_commit` and `_finish`, scheduler.py's)."""

    blocks: BlockManager
    events: list[Event | TokenEvents]
    _rows: DecodeRows | None

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
        check_tokens(decision, tokens, decision.iteration)
        return commit_sampled(decision, tokens, self.events, self._finish_late)

    def _finish_late(self, req: Request, phase: Phase, reason: Reason, iteration: int) -> None:
        """A stop token seen after later iterations were scheduled: the request's row (if any) leaves when the
        rows are rebuilt, and its blocks when the device is done with them (BlockManager.hold)."""
        self._rows = None
        self._finish(req, phase, reason, iteration)
