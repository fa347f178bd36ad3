"""The engine loop: schedule, prepare, forward, sample, detokenize, postprocess; each an NVTX range."""
from __future__ import annotations

import bisect
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field

import numpy as np

from itertrace.profiler.batch import Batch, Runner
from itertrace.profiler.gcquiet import no_full_collections
from itertrace.profiler.nvtx_ranges import ADMIT, ARRIVE, FINISH, PhaseName, Tracer, nvtx_recorded
from itertrace.profiler.request import Request
from itertrace.profiler.runlog import RunLog
from itertrace.profiler.scheduler import Decision, EventKind, Scheduler, TokenEvents
from itertrace.profiler.tokenizer import IncrementalDetokenizer, decode

NO_TIME = np.iinfo(np.int64).min  # no token yet


def _within(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """[len(values)] bool: each value is in `sorted_set` (sorted, unique)."""
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(sorted_set.searchsorted(values), len(sorted_set) - 1)
    return sorted_set[at] == values


def _output_text(token_ids: list[int]) -> str:
    """`decode(token_ids)`, in one C call when every id is a byte (always, for the simulated runner)."""
    try:
        return bytes(token_ids).decode("utf-8", errors="replace")
    except ValueError:  # an id outside 0..255 (a special token): decode drops it
        return decode(token_ids)


class _IdArray:
    """Id lists and arrays as compact int64 arrays, converted once per distinct object.

    The scheduler hands out the same member list and batch arrays for as long as they hold, so the
    iteration rows waiting for their row group share one array each instead of a copy per row.
    """

    def __init__(self) -> None:
        self._source: object = None
        self._array = np.empty(0, dtype=np.int64)

    def __call__(self, ids: list[int] | np.ndarray) -> np.ndarray:
        if ids is not self._source and (len(ids) or len(self._array)):  # one empty array serves all empty lists
            self._source, self._array = ids, np.array(ids, dtype=np.int64)
        return self._array


class NoProgress(RuntimeError):
    """The scheduler holds work but can run none of it, and no arrival can change that."""


@dataclass(slots=True)
class RequestTimes:
    """Per-request clock readings the summary needs (the run log holds the full story)."""

    arrival_ns: int
    intake_ns: int  # when the engine took it in (its arrive mark): at or after arrival_ns
    first_token_ns: int | None = None
    last_token_ns: int | None = None  # set when the run ends
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
    fast_forwarded: int = 0  # iterations run at once with others (Engine._run_quiet)


class Engine:
    """Runs a workload to completion through a scheduler and a runner, logging every iteration."""

    def __init__(self, scheduler: Scheduler, runner: Runner, clock, *, log: RunLog | None = None,
                 tracer: Tracer | None = None, keep_membership: bool = False, keep_tokens: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 on_iteration: Callable[[Decision, int, int], None] | None = None, fast_forward: bool = True) -> None:
        self.scheduler = scheduler
        self.runner = runner
        scheduler.read_tokens = getattr(runner, "reads_tokens", True)
        self.clock = clock
        self.log = log
        self.tracer = tracer or Tracer()
        self.keep_membership = keep_membership
        self.keep_tokens = keep_tokens
        self.progress = progress  # called with (iteration, requests arrived); it decides when to print
        # simulated iterations take microseconds: every thousandth will do; a model's, every one
        self._progress_every = 1000 if runner.simulated else 1
        self.on_iteration = on_iteration  # called with (decision, start_ns, end_ns) after each iteration
        # quiet iterations run at once (_run_quiet): only where a runner can, nobody watches each
        # iteration, and no tool records NVTX (each iteration keeps its step range under nsys)
        self._fast_forward = (fast_forward and getattr(runner, "decode_tokens", None) is not None
                              and on_iteration is None and not nvtx_recorded())
        # A real engine streams each token's text to its client; the simulated runner has no client,
        # so its text is decoded once, when the request row is written (the same text).
        self._stream_text = not runner.simulated
        self._detok: dict[int, IncrementalDetokenizer] = {}
        self._text: dict[int, list[str]] = {}
        self._times: dict[int, RequestTimes] = {}
        self._ids = np.empty(0, dtype=np.int64)  # every request id, sorted: rows of _last_token_ns
        self._dense_ids = False  # _ids is 0 .. n-1 (as workloads number requests): an id is its row
        self._last_token_ns = np.empty(0, dtype=np.int64)
        self._getting_tokens = np.empty(0, dtype=np.int64)  # sorted ids that got a token last iteration
        self._member_ids, self._scheduled_ids, self._finished_ids = _IdArray(), _IdArray(), _IdArray()

    def run(self, requests: Iterable[Request]) -> RunResult:
        """Run the requests until every one reaches a terminal state."""
        with no_full_collections():
            steps = self.steps(requests)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value

    def steps(self, requests: Iterable[Request]) -> Generator[None, None, RunResult]:
        """The run as a generator: it pauses before each pass of the loop and returns the RunResult.

        `run` drives it to the end; session.run_in_turn drives several at once, a pass each in turn.
        """
        pending = sorted(requests, key=lambda r: (r.arrival_ns, r.request_id))
        cancels: dict[int, list[int]] = {}
        for req in pending:
            if req.cancel_at_iteration is not None:
                cancels.setdefault(req.cancel_at_iteration, []).append(req.request_id)
        cancel_iterations = sorted(cancels)
        arrivals = [r.arrival_ns for r in pending]
        self._ids = np.sort(np.fromiter((r.request_id for r in pending), dtype=np.int64, count=len(pending)))
        self._dense_ids = np.array_equal(self._ids, np.arange(len(pending)))
        self._last_token_ns = np.full(len(pending), NO_TIME, dtype=np.int64)
        sched, clock, tracer = self.scheduler, self.clock, self.tracer
        next_arrival, iteration, idle_runs = 0, 0, 0
        result = RunResult(pending, self._times, 0, 0, 0, 0, clock.now_ns(), 0, bool(self.runner.simulated))
        while next_arrival < len(pending) or sched.has_work():
            yield
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
            if self._fast_forward:
                at = bisect.bisect_right(cancel_iterations, iteration)
                ran = self._run_quiet(decision, iteration, start, queued, preempted, result,
                                      pending[next_arrival].arrival_ns if next_arrival < len(pending) else None,
                                      cancel_iterations[at] if at < len(cancel_iterations) else None)
                if ran:
                    tracer.pop()
                    iteration += ran
                    if self.progress is not None:  # as if one by one
                        every = self._progress_every
                        for passed in range((iteration - ran) // every + 1, iteration // every + 1):
                            self.progress(passed * every, next_arrival)
                    continue
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
                if self._stream_text:
                    self._detokenize(decision.batch, tokens)
            t_detok = clock.now_ns()
            with tracer.phase(PhaseName.POSTPROCESS):
                for req in sched.postprocess(decision, tokens, iteration):
                    tracer.mark(FINISH, req.request_id)  # inside its step: it finished this iteration
                batch = decision.batch
                self._mark_tokens(iteration, np.sort(batch.sampled_ids))
            end = clock.now_ns()
            tracer.pop()

            self._flush_events(start, end)
            self._tally(result, decision, queued, 1)
            if self.on_iteration is not None:
                self.on_iteration(decision, start, end)
            if self.log is not None:
                marks = (t_sched, t_prep, t_fwd, t_samp, t_detok)
                self.log.iteration(self._iteration_row(decision, start, end, marks, queued, preempted))
            iteration += 1
            if self.progress is not None and iteration % self._progress_every == 0:
                self.progress(iteration, next_arrival)
        result.iterations = iteration
        result.end_ns = clock.now_ns()
        for rid, last in zip(self._ids.tolist(), self._last_token_ns.tolist()):
            if last != NO_TIME:
                self._times[rid].last_token_ns = last
        if self.log is not None:
            for req in pending:
                self.log.request(self._request_row(req))
        return result

    def _run_quiet(self, d: Decision, iteration: int, start: int, queued: int, preempted: int, result: RunResult,
                   next_arrival_ns: int | None, next_cancel: int | None) -> int:
        """Run this iteration (`d`, just scheduled) and the ones after it at once, when they are quiet.

        Quiet iterations (Scheduler.quiet_rows) run only the decode rows and differ only in positions,
        tokens, times and KV blocks, so the runner gives their times and tokens as arrays, the scheduler
        commits them in one go and their log rows go out as columns: the same rows, events and request
        state as a pass of the loop each (tests/test_fast_forward.py compares the two). It stops short
        of the iteration where a row finishes or may stop, a request arrives or is canceled, or the KV
        pool runs short: that one runs as usual. Returns how many iterations it ran (0: none; then
        this one runs as usual).
        """
        sched = self.scheduler
        rows = sched.quiet_rows(d)
        if rows is None:
            return 0
        steps = rows.steps_to_finish()
        if next_cancel is not None:
            steps = min(steps, next_cancel - iteration)
        if steps <= 0:
            return 0
        batch = d.batch
        dur = self.runner.decode_times(batch, steps)
        ends = start + np.cumsum(dur)
        starts = ends - dur
        if next_arrival_ns is not None:  # an arrival joins the first iteration that starts at or after it
            steps = min(steps, int(starts.searchsorted(next_arrival_ns)))
        tokens = self.runner.decode_tokens(batch, steps)
        steps = rows.first_stop(tokens)
        block_steps, block_rows = rows.blocks_ahead(steps)  # this iteration's blocks are taken already
        free = sched.blocks.device.num_free
        if len(block_rows) > free:  # the first iteration the pool cannot serve runs as usual (it preempts)
            steps = int(block_steps[free])
        if steps <= 0:
            return 0
        taken = int(block_steps.searchsorted(steps))
        block_steps, block_rows = block_steps[:taken], block_rows[:taken]
        tokens, dur, starts, ends = tokens[:steps], dur[:steps], starts[:steps], ends[:steps]
        allocated = np.bincount(block_steps, minlength=steps)
        in_use = sched.blocks.device.num_used + np.cumsum(allocated)
        allocated[0] = sched.blocks.allocated_this_iteration
        row = None
        if self.log is not None:  # before run_quiet moves the rows on: this iteration's row, as a template
            row = self._iteration_row(d, start, start, (start,) * 5, queued, preempted)
        sched.run_quiet(rows, tokens, block_steps, block_rows)
        self.clock.advance(int(ends[-1]) - start)

        ids, numbers = batch.request_ids, np.arange(iteration, iteration + steps, dtype=np.int64)
        self._mark_tokens(iteration, np.sort(ids))
        self._set_last_token(ids, ends[-1])
        if self.keep_tokens:
            end_ns, iterations = ends.tolist(), numbers.tolist()
            for rid in ids.tolist():
                self._times[rid].token_ns.extend(end_ns)
                self._times[rid].token_iterations.extend(iterations)
        self._tally(result, d, queued, steps)
        if row is not None:
            self.log.token_steps(ids, numbers, ends)
            self.log.iterations(row | {  # the rest as in this iteration's row (kv_freed: 0 in a quiet one)
                "iteration": numbers, "start_ns": starts, "end_ns": ends, "dur_ns": dur, "schedule_ns": 0,
                "prepare_ns": 0, "forward_ns": dur, "sample_ns": 0, "detokenize_ns": 0, "postprocess_ns": 0,
                "kv_allocated": allocated, "kv_in_use": in_use}, steps)
        result.fast_forwarded += steps
        return steps

    def _tally(self, result: RunResult, d: Decision, queued: int, steps: int) -> None:
        """Count `steps` iterations like `d`'s: idle slots (held by finished members, left while requests
        queued) and, when kept, membership."""
        idle = self.scheduler.config.max_num_seqs - d.batch.num_seqs
        result.idle_slot_iterations += steps * idle
        result.idle_finished += steps * len(d.finished_member_ids)
        if queued:
            result.idle_while_queued += steps * idle
        if self.keep_membership:
            result.membership.extend([d.member_ids] * steps)

    def _mark_admissions(self) -> None:
        """An `admit` mark for each request scheduled for the first time (inside this step)."""
        for ev in self.scheduler.events:
            if ev.kind is EventKind.ADMIT:
                self.tracer.mark(ADMIT, ev.request_id)

    def _mark_tokens(self, iteration: int, getting: np.ndarray) -> None:
        """A `tokens` mark when the set of requests that got a token differs from the last iteration's."""
        previous = self._getting_tokens
        if len(getting) != len(previous) or not (getting == previous).all():
            self.tracer.tokens(iteration, getting[~_within(getting, previous)].tolist(),
                               previous[~_within(previous, getting)].tolist())
            self._getting_tokens = getting

    def _detokenize(self, batch: Batch, tokens: np.ndarray) -> None:
        for rid, token in zip(batch.sampled_ids.tolist(), tokens.tolist()):
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
            if type(ev) is TokenEvents:
                self._stamp_tokens(ev, end_ns)
                continue
            ts = end_ns if ev.kind is EventKind.FINISH else start_ns
            times = self._times[ev.request_id]
            if ev.kind is EventKind.ARRIVE:
                ts = times.intake_ns
            elif ev.kind in (EventKind.FINISH, EventKind.CANCEL, EventKind.REJECT):
                times.finish_ns = ts
                if ev.kind is not EventKind.FINISH:  # finishes are marked inside their step
                    self.tracer.mark(FINISH, ev.request_id)
                self._end(ev.request_id)
            if self.log is not None:
                self.log.event(ev.request_id, ev.iteration, ts, ev.kind.value,
                               ev.reason.value if ev.reason is not None else None, ev.tokens)
        self.scheduler.events.clear()

    def _stamp_tokens(self, ev: TokenEvents, ts: int) -> None:
        """Token events, all at the iteration's end: first-token times, last-token times, the log rows."""
        ids = ev.request_ids
        for rid in ids[ev.first].tolist():
            times = self._times[rid]
            if times.first_token_ns is None:
                times.first_token_ns = ts
        self._set_last_token(ids, ts)
        if self.keep_tokens:
            for rid in ids.tolist():
                times = self._times[rid]
                times.token_ns.append(ts)
                times.token_iterations.append(ev.iteration)
        if self.log is not None:
            self.log.token_events(ids, ev.iteration, ts, ev.first)

    def _set_last_token(self, ids: np.ndarray, ts: int) -> None:
        self._last_token_ns[ids if self._dense_ids else self._ids.searchsorted(ids)] = ts

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
            "member_ids": self._member_ids(d.member_ids), "scheduled_ids": self._scheduled_ids(d.batch.request_ids),
            "finished_member_ids": self._finished_ids(d.finished_member_ids), "num_seqs": len(d.work),
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
            "text": "".join(self._text.get(req.request_id, ())) if self._stream_text else _output_text(req.output_ids),
            "simulated": bool(self.runner.simulated),
        }

