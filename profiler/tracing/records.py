"""What a run keeps besides its requests: per-request times, event stamps, NVTX marks, run-log rows, tallies."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from itertrace.profiler.scheduling.batch import Runner
from itertrace.profiler.scheduling.decision import Decision, EventKind, TokenEvents
from itertrace.profiler.tracing.nvtx_ranges import ADMIT, ARRIVE, FINISH, Tracer
from itertrace.profiler.scheduling.request import Request
from itertrace.profiler.tracing.runlog import RunLog
from itertrace.profiler.scheduling.scheduler import Scheduler
from itertrace.profiler.workloads.tokenizer import IncrementalDetokenizer, decode

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
    start_ns: int
    simulated: bool
    iterations: int = 0
    end_ns: int = 0
    idle_slot_iterations: int = 0  # capacity minus running sequences, summed over iterations
    idle_finished: int = 0  # of those, slots held by finished static members
    idle_while_queued: int = 0  # idle slot-iterations while requests were waiting
    membership: list[list[int]] = field(default_factory=list)  # member ids by iteration, when kept
    iterations_in_bulk: int = 0  # iterations run at once with others (profiler/bulk.py)
    iterations_chained: int = 0  # of those, a prompt's thrash run as a chain of its cycles (profiler/thrash.py)
    tokens_dropped: int = 0  # overlap mode: tokens computed for requests that had ended (never emitted)


class RunRecord:
    """The engine's books: request times, the `arrive`/`admit`/`finish`/`tokens` marks, streamed text,
    event stamps and the run log's rows."""

    def __init__(self, scheduler: Scheduler, runner: Runner, tracer: Tracer, log: RunLog | None, *,
                 keep_membership: bool, keep_tokens: bool) -> None:
        self.scheduler, self.runner, self.tracer, self.log = scheduler, runner, tracer, log
        self.keep_membership, self.keep_tokens = keep_membership, keep_tokens
        # A real engine streams each token's text to its client; the simulated runner has no client,
        # so its text is decoded once, when the request row is written (the same text).
        self.streams_text = not runner.simulated
        self._detok: dict[int, IncrementalDetokenizer] = {}
        self._text: dict[int, list[str]] = {}
        self.times: dict[int, RequestTimes] = {}
        self._ids = np.empty(0, dtype=np.int64)  # every request id, sorted: rows of _last_token_ns
        self._dense_ids = False  # _ids is 0 .. n-1 (as workloads number requests): an id is its row
        self._last_token_ns = np.empty(0, dtype=np.int64)
        self._getting_tokens = np.empty(0, dtype=np.int64)  # sorted ids that got a token last iteration
        self._member_ids, self._scheduled_ids, self._finished_ids = _IdArray(), _IdArray(), _IdArray()

    # ---- the run as a whole ----------------------------------------------------------------------------
    def begin(self, requests: list[Request], start_ns: int) -> RunResult:
        """Make room for the run's requests; the result the run fills in."""
        self._ids = np.sort(np.fromiter((r.request_id for r in requests), dtype=np.int64, count=len(requests)))
        self._dense_ids = np.array_equal(self._ids, np.arange(len(requests)))
        self._last_token_ns = np.full(len(requests), NO_TIME, dtype=np.int64)
        return RunResult(requests=requests, times=self.times, start_ns=start_ns, simulated=bool(self.runner.simulated))

    def end(self, result: RunResult, iterations: int, end_ns: int) -> RunResult:
        """Close the books: last-token times, and a request row each."""
        result.iterations, result.end_ns = iterations, end_ns
        for rid, last in zip(self._ids.tolist(), self._last_token_ns.tolist()):
            if last != NO_TIME:
                self.times[rid].last_token_ns = last
        if self.log is not None:
            for req in result.requests:
                self.log.request(self._request_row(req))
        return result

    def take_in(self, req: Request, now_ns: int) -> None:
        """The engine takes a request in (its arrive mark)."""
        self.times[req.request_id] = RequestTimes(req.arrival_ns, now_ns)
        self.tracer.mark(ARRIVE, req.request_id)

    def tally(self, result: RunResult, d: Decision, queued: int, steps: int) -> None:
        """Count `steps` iterations like `d`'s: idle slots (held by finished members, left while requests
        queued) and, when kept, membership."""
        idle = self.scheduler.config.max_num_seqs - d.batch.num_seqs
        result.idle_slot_iterations += steps * idle
        result.idle_finished += steps * len(d.finished_member_ids)
        if queued:
            result.idle_while_queued += steps * idle
        if self.keep_membership:
            result.membership.extend([d.member_ids] * steps)

    # ---- marks and text --------------------------------------------------------------------------------
    def mark_admissions(self) -> None:
        """An `admit` mark for each request scheduled for the first time (inside this step)."""
        for ev in self.scheduler.events:
            if ev.kind is EventKind.ADMIT:
                self.tracer.mark(ADMIT, ev.request_id)

    def mark_tokens(self, iteration: int, getting: np.ndarray) -> None:
        """A `tokens` mark when the set of requests that got a token differs from the last iteration's."""
        previous = self._getting_tokens
        if len(getting) != len(previous) or not (getting == previous).all():
            self.tracer.tokens(iteration, getting[~_within(getting, previous)].tolist(),
                               previous[~_within(previous, getting)].tolist())
            self._getting_tokens = getting

    def no_tokens(self, iteration: int) -> None:
        """An iteration with no forward pass: nobody got a token."""
        self.mark_tokens(iteration, self._getting_tokens[:0])

    def detokenize(self, request_ids: np.ndarray, tokens: np.ndarray) -> None:
        """Stream each sampled token's text (a real engine's clients get it now); the simulated runner's is
        decoded when its request row is written."""
        if not self.streams_text:
            return
        for rid, token in zip(request_ids.tolist(), tokens.tolist()):
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

    # ---- events ------------------------------------------------------------------------------------------
    def flush_events(self, start_ns: int, end_ns: int, spans: dict[int, tuple[int, int]] | None = None) -> None:
        """Stamp the scheduler's events: tokens and finishes at the iteration's end, the rest at its start;
        `spans` gives (start, end) of other iterations whose events are among them (overlap mode).

        An arrive event gets the time the engine took the request in, read just before its NVTX mark,
        which is at or after the workload's arrival time (run_requests.arrival_ns).
        """
        for ev in self.scheduler.events:
            start, end = spans.get(ev.iteration, (start_ns, end_ns)) if spans else (start_ns, end_ns)
            if type(ev) is TokenEvents:
                self._stamp_tokens(ev, end)
                continue
            ts = end if ev.kind is EventKind.FINISH else start
            times = self.times[ev.request_id]
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
            times = self.times[rid]
            if times.first_token_ns is None:
                times.first_token_ns = ts
        self.set_last_token(ids, ts)
        if self.keep_tokens:
            for rid in ids.tolist():
                times = self.times[rid]
                times.token_ns.append(ts)
                times.token_iterations.append(ev.iteration)
        if self.log is not None:
            self.log.token_events(ids, ev.iteration, ts, ev.first)

    def set_last_token(self, ids: np.ndarray, ts: int) -> None:
        self._last_token_ns[ids if self._dense_ids else self._ids.searchsorted(ids)] = ts

    def tokens_in_bulk(self, ids: np.ndarray, iterations: np.ndarray, ends_ns: np.ndarray,
                       chunk: tuple[int, int, np.ndarray] | None = None) -> None:
        """Token times of rows that got a token in each of several iterations run at once (no first tokens);
        `chunk`: (request id, tokens, [iterations] start ns) of a prompt chunk run in each of them, whose events
        after the first iteration's go out here too (the first's went out with the scheduler's events)."""
        self.set_last_token(ids, ends_ns[-1])
        if self.keep_tokens:
            end_ns, numbers = ends_ns.tolist(), iterations.tolist()
            for rid in ids.tolist():
                self.times[rid].token_ns.extend(end_ns)
                self.times[rid].token_iterations.extend(numbers)
        if self.log is not None:
            self.log.token_steps(ids, iterations, ends_ns, chunk)

    # ---- run-log rows --------------------------------------------------------------------------------------
    def kv_counts(self) -> tuple[int, int, int]:
        """KV blocks allocated and freed this iteration, and in use, as the scheduler leaves them now."""
        blocks = self.scheduler.blocks
        return blocks.allocated_this_iteration, blocks.freed_this_iteration, blocks.device.num_used

    def iteration_row(self, d: Decision, start: int, end: int, phases_ns: tuple[int, ...], queued: int,
                      preempted: int, device: tuple[int, int] | None, *, kv: tuple[int, int, int] | None = None,
                      dropped: int = 0) -> dict:
        """One iteration-log row (`phases_ns`: ns per phase, in PhaseName order; `device`: when its forward
        pass started and ended, None without one); queue counts and `kv` (kv_counts) are as the scheduler
        left them after scheduling, `kv` read now when not given."""
        sched = self.scheduler
        schedule_ns, prepare_ns, forward_ns, sample_ns, detokenize_ns, postprocess_ns = phases_ns
        if kv is None:
            blocks = sched.blocks
            allocated, freed, used = blocks.allocated_this_iteration, blocks.freed_this_iteration, blocks.device.num_used
        else:
            allocated, freed, used = kv
        device_start, device_end = device or (None, None)
        return {
            "iteration": d.iteration, "start_ns": start, "end_ns": end, "dur_ns": end - start,
            "schedule_ns": schedule_ns, "prepare_ns": prepare_ns, "forward_ns": forward_ns,
            "sample_ns": sample_ns, "detokenize_ns": detokenize_ns, "postprocess_ns": postprocess_ns,
            "member_ids": self._member_ids(d.member_ids), "scheduled_ids": self._scheduled_ids(d.batch.request_ids),
            "finished_member_ids": self._finished_ids(d.finished_member_ids), "num_seqs": len(d.work),
            "prefill_tokens": d.prefill_tokens, "decode_tokens": d.decode_tokens,
            "slots_finished": len(d.finished_member_ids), "slots_stalled": len(d.stalled_member_ids),
            "slots_empty": sched.config.max_num_seqs - len(d.member_ids),
            "token_budget": sched.config.max_num_batched_tokens, "seq_budget": sched.config.max_num_seqs,
            "policy": sched.config.policy.value, "limit": d.limit.value,
            "admitted": d.admitted, "resumed": d.resumed, "preempted": d.preempted, "rejected": d.rejected,
            "kv_allocated": allocated, "kv_freed": freed,
            "kv_in_use": used, "num_waiting": queued - preempted, "num_preempted": preempted,
            "simulated": bool(self.runner.simulated),
            "device_start_ns": device_start, "device_end_ns": device_end, "dropped_tokens": dropped,
        }

    def _request_row(self, req: Request) -> dict:
        times = self.times.get(req.request_id)
        return {
            "request_id": req.request_id, "arrival_ns": req.arrival_ns, "prompt_tokens": len(req.prompt_ids),
            "output_tokens": len(req.output_ids), "max_tokens": req.sampling.max_tokens,
            "priority": req.priority, "tenant": req.tenant, "deadline_ns": req.deadline_ns,
            "final_state": req.phase.value, "stop_reason": req.stop_reason.value if req.stop_reason else None,
            "first_scheduled_iteration": req.first_scheduled_iteration, "num_preemptions": req.num_preemptions,
            "first_token_ns": times.first_token_ns if times else None,
            "finish_ns": times.finish_ns if times else None,
            "text": "".join(self._text.get(req.request_id, ())) if self.streams_text else _output_text(req.output_ids),
            "simulated": bool(self.runner.simulated),
        }
