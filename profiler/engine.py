"""The engine loop: schedule, prepare, forward, sample, detokenize, postprocess; each an NVTX range."""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from itertrace.profiler.batch import Runner
from itertrace.profiler.nvtx_ranges import ADMIT, ARRIVE, FINISH, PhaseName, Tracer
from itertrace.profiler.request import Request
from itertrace.profiler.runlog import RunLog
from itertrace.profiler.scheduler import Decision, EventKind, Scheduler
from itertrace.profiler.tokenizer import IncrementalDetokenizer


class NoProgress(RuntimeError):
    """The scheduler holds work but can run none of it, and no arrival can change that."""


@dataclass
class RequestTimes:
    """Per-request clock readings the summary needs (the run log holds the full story)."""

    arrival_ns: int
    intake_ns: int  # when the engine took it in (its arrive mark): at or after arrival_ns
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    finish_ns: int | None = None  # when it reached a terminal state
    token_ns: list[int] = field(default_factory=list)  # filled only with keep_tokens
    token_iterations: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    requests: list[Request]
    times: dict[int, RequestTimes]
    iterations: int
    idle_slot_iterations: int  # capacity minus running sequences, summed over iterations
    idle_finished: int  # of those, slots held by finished static members
    idle_while_queued: int  # idle slot-iterations while requests were waiting
    start_ns: int
    end_ns: int
    simulated: bool
    membership: list[list[int]] = field(default_factory=list)  # member ids by iteration, when kept


class Engine:
    """Runs a workload to completion through a scheduler and a runner, logging every iteration."""

    def __init__(self, scheduler: Scheduler, runner: Runner, clock, *, log: RunLog | None = None,
                 tracer: Tracer | None = None, keep_membership: bool = False, keep_tokens: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 on_iteration: Callable[[Decision, int, int], None] | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.log = log
        self.tracer = tracer or Tracer()
        self.keep_membership = keep_membership
        self.keep_tokens = keep_tokens
        self.progress = progress
        self.on_iteration = on_iteration  # called with (decision, start_ns, end_ns) after each iteration
        self._detok: dict[int, IncrementalDetokenizer] = {}
        self._text: dict[int, list[str]] = {}
        self._times: dict[int, RequestTimes] = {}
        self._getting_tokens = np.empty(0, dtype=np.int64)  # sorted ids that got a token last iteration

    def run(self, requests: Iterable[Request]) -> RunResult:
        pending = sorted(requests, key=lambda r: (r.arrival_ns, r.request_id))
        cancels: dict[int, list[int]] = {}
        for req in pending:
            if req.cancel_at_iteration is not None:
                cancels.setdefault(req.cancel_at_iteration, []).append(req.request_id)
        arrivals = [r.arrival_ns for r in pending]
        sched, clock, tracer = self.scheduler, self.clock, self.tracer
        cfg = sched.config
        next_arrival, iteration, idle_runs = 0, 0, 0
        result = RunResult(pending, self._times, 0, 0, 0, 0, clock.now_ns(), 0, bool(self.runner.simulated))
        while next_arrival < len(pending) or sched.has_work():
            now = clock.now_ns()
            upto = bisect.bisect_right(arrivals, now, lo=next_arrival)
            for req in pending[next_arrival:upto]:
                self._times[req.request_id] = RequestTimes(req.arrival_ns, clock.now_ns())
                tracer.mark(ARRIVE, req.request_id)
                sched.add(req, iteration)
            next_arrival = upto
            for rid in cancels.pop(iteration, ()):
                sched.cancel(rid, iteration)
            self._flush_events(now, now)
            if not sched.has_work():
                if next_arrival < len(pending):
                    clock.sleep_until(pending[next_arrival].arrival_ns)
                continue

            start = clock.now_ns()
            tracer.push_step(iteration)
            with tracer.phase(PhaseName.SCHEDULE):
                decision = sched.schedule(iteration)
                self._mark_admissions()
            t_sched = clock.now_ns()
            queued = len(sched.waiting)
            preempted = sched.waiting.num_preempted
            if not decision.work:  # nothing runnable: an iteration with no forward pass, logged as such
                self._mark_tokens(iteration, self._getting_tokens[:0])
                tracer.pop()
                self._flush_events(start, t_sched)
                if self.log is not None:
                    self.log.iteration(self._iteration_row(decision, start, t_sched, (t_sched,) * 5, queued, preempted))
                iteration += 1
                idle_runs += 1
                if next_arrival < len(pending):
                    clock.sleep_until(pending[next_arrival].arrival_ns)
                elif idle_runs > 1:
                    raise NoProgress(f"iteration {iteration}: {len(sched.waiting)} waiting, "
                                     f"{len(sched.running)} running, nothing schedulable ({decision.limit.value})")
                continue
            idle_runs = 0
            with tracer.phase(PhaseName.PREPARE):
                if decision.swap.swap_out or decision.swap.swap_in:
                    self.runner.swap(decision.swap)
                prepared = self.runner.prepare(decision.batch)
            t_prep = clock.now_ns()
            with tracer.phase(PhaseName.FORWARD):
                logits = self.runner.forward(prepared)
            t_fwd = clock.now_ns()
            with tracer.phase(PhaseName.SAMPLE):
                tokens = self.runner.sample(decision.batch, logits)
            t_samp = clock.now_ns()
            with tracer.phase(PhaseName.DETOKENIZE):
                self._detokenize(tokens)
            t_detok = clock.now_ns()
            with tracer.phase(PhaseName.POSTPROCESS):
                for req in sched.postprocess(decision, tokens, iteration):
                    tracer.mark(FINISH, req.request_id)  # inside its step: it finished this iteration
                batch = decision.batch
                self._mark_tokens(iteration, np.sort(batch.request_ids[batch.sample]))
            end = clock.now_ns()
            tracer.pop()

            self._flush_events(start, end)
            idle = cfg.max_num_seqs - len(decision.work)
            result.idle_slot_iterations += idle
            result.idle_finished += len(decision.finished_member_ids)
            if queued:
                result.idle_while_queued += idle
            if self.keep_membership:
                result.membership.append(decision.member_ids)
            if self.on_iteration is not None:
                self.on_iteration(decision, start, end)
            if self.log is not None:
                marks = (t_sched, t_prep, t_fwd, t_samp, t_detok)
                self.log.iteration(self._iteration_row(decision, start, end, marks, queued, preempted))
            iteration += 1
            if self.progress is not None and iteration % 1000 == 0:
                self.progress(iteration, next_arrival)
        result.iterations = iteration
        result.end_ns = clock.now_ns()
        if self.log is not None:
            for req in pending:
                self.log.request(self._request_row(req))
        return result

    def _mark_admissions(self) -> None:
        """An `admit` mark for each request scheduled for the first time (inside this step)."""
        for ev in self.scheduler.events:
            if ev.kind is EventKind.ADMIT:
                self.tracer.mark(ADMIT, ev.request_id)

    def _mark_tokens(self, iteration: int, getting: np.ndarray) -> None:
        """A `tokens` mark when the set of requests that got a token differs from the last iteration's."""
        previous = self._getting_tokens
        if not np.array_equal(getting, previous):
            self.tracer.tokens(iteration, np.setdiff1d(getting, previous, assume_unique=True).tolist(),
                               np.setdiff1d(previous, getting, assume_unique=True).tolist())
            self._getting_tokens = getting

    def _detokenize(self, tokens: dict[int, int]) -> None:
        for rid, token in tokens.items():
            detok = self._detok.get(rid)
            if detok is None:
                detok = self._detok[rid] = IncrementalDetokenizer()
                self._text[rid] = []
            self._text[rid].append(detok.push(token))

    def _end(self, request_id: int) -> None:
        """A request reached a terminal state: drop its sampler state, finish its text."""
        self.runner.release(request_id)
        detok = self._detok.pop(request_id, None)
        if detok is not None:
            self._text[request_id].append(detok.flush())

    def _flush_events(self, start_ns: int, end_ns: int) -> None:
        """Stamp the scheduler's events: tokens and finishes at the iteration's end, the rest at its start.

        An arrive event gets the time the engine took the request in, read just before its NVTX mark,
        which is at or after the workload's arrival time (run_requests.arrival_ns).
        """
        for ev in self.scheduler.events:
            late = ev.kind in (EventKind.FIRST_TOKEN, EventKind.TOKEN, EventKind.FINISH)
            ts = end_ns if late else start_ns
            times = self._times[ev.request_id]
            if ev.kind is EventKind.ARRIVE:
                ts = times.intake_ns
            elif ev.kind in (EventKind.FINISH, EventKind.CANCEL, EventKind.REJECT):
                times.finish_ns = ts
                if ev.kind is not EventKind.FINISH:  # finishes are marked inside their step
                    self.tracer.mark(FINISH, ev.request_id)
                self._end(ev.request_id)
            elif late:
                if times.first_token_ns is None:
                    times.first_token_ns = ts
                times.last_token_ns = ts
                if self.keep_tokens:
                    times.token_ns.append(ts)
                    times.token_iterations.append(ev.iteration)
            if self.log is not None:
                self.log.event(ev.request_id, ev.iteration, ts, ev.kind.value,
                               ev.reason.value if ev.reason is not None else None, ev.tokens)
        self.scheduler.events.clear()

    def _iteration_row(self, d: Decision, start: int, end: int, marks: tuple[int, ...], queued: int,
                       preempted: int) -> dict:
        """One iteration-log row; queue counts are as the scheduler left them."""
        sched = self.scheduler
        t_sched, t_prep, t_fwd, t_samp, t_detok = marks
        used = sched.blocks.device.num_used
        return {
            "iteration": d.iteration, "start_ns": start, "end_ns": end, "dur_ns": end - start,
            "schedule_ns": t_sched - start, "prepare_ns": t_prep - t_sched, "forward_ns": t_fwd - t_prep,
            "sample_ns": t_samp - t_fwd, "detokenize_ns": t_detok - t_samp, "postprocess_ns": end - t_detok,
            "member_ids": d.member_ids, "scheduled_ids": d.batch.request_ids.tolist(),
            "finished_member_ids": d.finished_member_ids, "num_seqs": len(d.work),
            "prefill_tokens": d.prefill_tokens, "decode_tokens": d.decode_tokens,
            "slots_finished": len(d.finished_member_ids), "slots_stalled": len(d.stalled_member_ids),
            "slots_empty": sched.config.max_num_seqs - len(d.member_ids),
            "token_budget": sched.config.max_num_batched_tokens, "seq_budget": sched.config.max_num_seqs,
            "policy": sched.config.policy.value, "limit": d.limit.value,
            "admitted": d.admitted, "resumed": d.resumed, "preempted": d.preempted, "rejected": d.rejected,
            "kv_allocated": sched.blocks.allocated_this_iteration, "kv_freed": sched.blocks.freed_this_iteration,
            "kv_in_use": used, "num_waiting": queued - preempted, "num_preempted": preempted,
            "simulated": bool(self.runner.simulated),
        }

    def _request_row(self, req: Request) -> dict:
        times = self._times.get(req.request_id)
        return {
            "request_id": req.request_id, "arrival_ns": req.arrival_ns, "prompt_tokens": len(req.prompt_ids),
            "output_tokens": len(req.output_ids), "max_tokens": req.sampling.max_tokens,
            "priority": req.priority, "tenant": req.tenant, "deadline_ns": req.deadline_ns,
            "final_state": req.phase.value, "stop_reason": req.stop_reason.value if req.stop_reason else None,
            "first_scheduled_iteration": req.first_scheduled_iteration, "num_preemptions": req.num_preemptions,
            "first_token_ns": times.first_token_ns if times else None,
            "finish_ns": times.finish_ns if times else None,
            "text": "".join(self._text.get(req.request_id, ())),
            "simulated": bool(self.runner.simulated),
        }

