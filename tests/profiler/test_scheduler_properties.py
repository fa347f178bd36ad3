"""Property-based tests: random arrivals, cancellations and KV pressure under every mode and policy.

At every iteration: budgets hold, no KV block is shared or dangling, and the pool's books balance.
At the end: every request is in exactly one terminal state, none is lost, every block is back, and each
recorded transition happened at the iteration, and for the reason, of the scheduler event that made it.
Under KV pressure (requests that fit the pool one at a time, not all at once): the same, with
preemptions, swap-outs and reject-mode refusals common. Under priority with aging: no request starves.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from itertrace.profiler.clock import SimClock
from itertrace.profiler.engine import Engine
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import Policy
from itertrace.profiler.scheduling.request import Phase, PreemptKind, Reason
from itertrace.profiler.tracing.runlog import RunLog
from itertrace.profiler.scheduling.scheduler import Mode, Scheduler, SchedulerConfig
from itertrace.profiler.runners.sim_runner import SimulatedRunner
from itertrace.profiler.workloads import RequestSpec, build_requests

requests = st.lists(
    st.builds(
        RequestSpec,
        arrival_ns=st.integers(0, 200_000_000),
        prompt_tokens=st.integers(1, 80),
        output_tokens=st.integers(1, 40),
        priority=st.integers(0, 2),
        deadline_ns=st.one_of(st.none(), st.integers(0, 500_000_000)),
        cancel_at_iteration=st.one_of(st.none(), st.none(), st.integers(0, 60)),
    ),
    min_size=1, max_size=24,
)

configs = st.builds(
    SchedulerConfig,
    mode=st.sampled_from(list(Mode)),
    policy=st.sampled_from(list(Policy)),
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(1, 96),
    chunked_prefill=st.booleans(),
    decode_reserve=st.sampled_from([0.0, 0.25, 0.5]),
    preemption=st.sampled_from(list(PreemptKind)),
    aging_iterations=st.integers(1, 50),
)


class InvariantChecker:
    """Called after every iteration with the decision; raises on the first broken invariant."""

    def __init__(self, sched: Scheduler, reqs) -> None:
        self.sched, self.reqs = sched, reqs
        self.iterations = 0

    def __call__(self, d, start_ns: int, end_ns: int) -> None:
        cfg, blocks = self.sched.config, self.sched.blocks
        self.iterations += 1
        assert 0 < d.batch.num_tokens_total <= cfg.max_num_batched_tokens
        assert len(d.work) <= cfg.max_num_seqs and len(d.member_ids) <= cfg.max_num_seqs
        reserve = int(cfg.decode_reserve * cfg.max_num_batched_tokens)
        assert d.prefill_tokens <= cfg.max_num_batched_tokens - max(reserve, d.decode_tokens)
        assert len(set(d.batch.request_ids.tolist())) == d.batch.num_seqs
        assert [r.request_id for r, _ in d.work] == d.batch.request_ids.tolist()
        for s in d.batch.seqs:  # the table the forward pass used covered every position it wrote
            assert len(s.block_table) * blocks.block_size >= s.start_pos + len(s.token_ids)
        owners = blocks.device.owners()
        held = 0
        for r in self.reqs:
            for b in r.block_ids:
                assert owners.get(b) == r.request_id, f"request {r.request_id} points at block {b} it does not own"
            if r.phase.terminal and cfg.mode is Mode.CONTINUOUS:
                assert not r.block_ids, f"finished request {r.request_id} still holds blocks"
            if r.phase is Phase.REJECTED or r in self.sched.waiting:  # queued requests hold no blocks
                assert not r.block_ids
            held += len(r.block_ids)
        assert held == blocks.device.num_used == len(owners)
        swap_held = sum(len(r.swap_slots) for r in self.reqs)
        assert swap_held == blocks.swap.num_used


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=requests, cfg=configs, num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 4, 16]),
       swap_blocks=st.integers(0, 12))
def test_scheduler_invariants_hold(specs, cfg, num_blocks, block_size, swap_blocks):
    reqs = build_requests(specs)
    clock = SimClock()
    blocks = BlockManager(num_blocks, block_size, swap_blocks)
    sched = Scheduler(cfg, blocks)
    checker = InvariantChecker(sched, reqs)
    Engine(sched, SimulatedRunner(clock), clock, on_iteration=checker).run(reqs)
    assert_run_ended_cleanly(reqs, sched, num_blocks, swap_blocks)


def assert_run_ended_cleanly(reqs, sched: Scheduler, num_blocks: int, swap_blocks: int) -> None:
    """Every request ends in exactly one terminal state, none is lost, every block is back."""
    cfg, blocks = sched.config, sched.blocks
    assert all(r.phase.terminal for r in reqs)
    for r in reqs:
        terminal = [t for t in r.transitions if t.dst.terminal]
        assert len(terminal) == 1 and terminal[0] is r.transitions[-1]
        assert r.transitions[0].src is Phase.WAITING
        for a, b in zip(r.transitions, r.transitions[1:]):
            assert a.dst is b.src
        if r.phase is Phase.FINISHED_LENGTH:
            assert len(r.output_ids) == r.sampling.max_tokens
        if r.phase is Phase.REJECTED:
            assert not r.output_ids
    assert not sched.has_work()
    assert blocks.device.num_free == num_blocks and blocks.swap.num_free == swap_blocks
    if cfg.preemption is PreemptKind.REJECT:
        assert all(r.num_preemptions == 0 for r in reqs)


@settings(max_examples=60, deadline=None)
@given(specs=requests, cfg=configs)
def test_event_log_tells_each_request_story_once(specs, cfg):
    reqs = build_requests(specs)
    clock = SimClock()
    sched = Scheduler(cfg, BlockManager(64, 4, 16))
    with tempfile.TemporaryDirectory() as tmp:
        log = RunLog(Path(tmp))
        Engine(sched, SimulatedRunner(clock), clock, log=log).run(reqs)
        log.close({})
        events = pq.read_table(Path(tmp) / "events.parquet").to_pylist()
    seen: dict[int, list[str]] = {}
    for ev in events:
        seen.setdefault(ev["request_id"], []).append(ev["kind"])
    assert sorted(seen) == [r.request_id for r in reqs]
    for r in reqs:
        kinds = seen[r.request_id]
        assert kinds[0] == "arrive"
        assert sum(k in ("finish", "cancel", "reject") for k in kinds) == 1
        assert kinds[-1] in ("finish", "cancel", "reject")
        assert kinds.count("first_token") == (1 if r.output_ids else 0)
        assert kinds.count("token") + kinds.count("first_token") == len(r.output_ids)
        assert kinds.count("preempt") == r.num_preemptions
        resumed = sum(t.reason is Reason.RESUMED for t in r.transitions)
        assert kinds.count("resume") == resumed
    assert_transitions_match_events(reqs, events)


# the event each kind of transition goes with, and the reasons it may give
_EVENT_REASONS = {"admit": {"admitted"}, "resume": {"resumed"}, "preempt": {"kv_exhausted"},
                  "finish": {"stop_token", "max_tokens"}, "cancel": {"cancel_requested"},
                  "reject": {"too_long", "no_kv_for_admission"}}


def _event_kind(t) -> str:
    if t.dst.terminal:
        return {Phase.CANCELED: "cancel", Phase.REJECTED: "reject"}.get(t.dst, "finish")
    if t.dst is Phase.PREEMPTED:
        return "preempt"
    return "resume" if t.src is Phase.PREEMPTED else "admit"


def assert_transitions_match_events(reqs, events: list[dict]) -> None:
    """Each transition is recorded at the iteration, and with the reason, of the event the scheduler emitted
    when it happened: admit, resume, preempt, finish, cancel, reject one for one, in order; and the end of
    a prompt (PROMPT_DONE) at an iteration where the request ran a prefill chunk and sampled a token."""
    moves: dict[int, list[tuple]] = {}  # request id -> (iteration, kind, reason) of its state-changing events
    chunks, sampled = set(), set()  # (request id, iteration)
    for ev in events:
        at = (ev["request_id"], ev["iteration"])
        if ev["kind"] == "prefill_chunk":
            chunks.add(at)
        elif ev["kind"] in ("token", "first_token"):
            sampled.add(at)
        elif ev["kind"] != "arrive":
            moves.setdefault(ev["request_id"], []).append((ev["iteration"], ev["kind"], ev["reason"]))
    for r in reqs:
        recorded = [(t.iteration, _event_kind(t), t.reason.value) for t in r.transitions
                    if t.reason is not Reason.PROMPT_DONE]
        assert recorded == moves.get(r.request_id, []), r.request_id
        assert all(reason in _EVENT_REASONS[kind] for _, kind, reason in recorded), recorded
        for t in r.transitions:
            if t.reason is Reason.PROMPT_DONE:
                assert (t.src, t.dst) == (Phase.PREFILL, Phase.DECODE)
                assert (r.request_id, t.iteration) in chunks and (r.request_id, t.iteration) in sampled, t


@st.composite
def kv_pressure(draw, preemption: PreemptKind):
    """Requests close together that each fit the KV pool but not all at once: preemptions (and in mode
    "swap", swap-outs, most with room in a swap pool of half to twice the device's) or reject-mode
    refusals are common. The general strategies above mostly reject such requests on arrival, or run
    them one after the other."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    specs = draw(st.lists(
        st.builds(RequestSpec, arrival_ns=st.integers(0, 20_000_000), prompt_tokens=st.integers(1, 24),
                  output_tokens=st.integers(2, 24), priority=st.integers(0, 2),
                  cancel_at_iteration=st.one_of(st.none(), st.none(), st.none(), st.integers(0, 40))),
        min_size=3, max_size=12))
    largest = max(-(-(s.prompt_tokens + s.output_tokens) // block_size) for s in specs)  # worst case, in blocks
    num_blocks = draw(st.integers(largest, largest + largest // 2))
    swap_blocks = draw(st.integers(num_blocks // 2, 2 * num_blocks)) if preemption is PreemptKind.SWAP else 0
    cfg = draw(st.builds(  # static batches preallocate and never preempt: one example in four
        SchedulerConfig, mode=st.sampled_from([Mode.CONTINUOUS] * 3 + [Mode.STATIC]),
        policy=st.sampled_from(list(Policy)), max_num_seqs=st.integers(3, 8),
        max_num_batched_tokens=st.integers(24, 64), chunked_prefill=st.booleans(),
        decode_reserve=st.sampled_from([0.0, 0.25]), aging_iterations=st.integers(1, 20),
        preemption=st.just(preemption)))
    return specs, cfg, num_blocks, block_size, swap_blocks


@pytest.mark.parametrize("preemption", list(PreemptKind))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_hold_under_kv_pressure(preemption, data):
    """The invariants and the transition records of the tests above, where preemption, swapping and refusal
    happen in most examples (a broken swap-out or reservation shows here first)."""
    specs, cfg, num_blocks, block_size, swap_blocks = data.draw(kv_pressure(preemption))
    reqs = build_requests(specs)
    clock = SimClock()
    sched = Scheduler(cfg, BlockManager(num_blocks, block_size, swap_blocks))
    with tempfile.TemporaryDirectory() as tmp:
        log = RunLog(Path(tmp))
        Engine(sched, SimulatedRunner(clock), clock, log=log, on_iteration=InvariantChecker(sched, reqs)).run(reqs)
        log.close({})
        events = pq.read_table(Path(tmp) / "events.parquet").to_pylist()
    assert_run_ended_cleanly(reqs, sched, num_blocks, swap_blocks)
    assert_transitions_match_events(reqs, events)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(st.builds(RequestSpec, arrival_ns=st.integers(0, 400_000_000), prompt_tokens=st.integers(1, 16),
                                output_tokens=st.integers(1, 16), priority=st.integers(0, 2)),
                      min_size=1, max_size=40),
       mode=st.sampled_from(list(Mode)), seqs=st.integers(1, 3), aging=st.integers(1, 30))
def test_priority_with_aging_starves_no_class(specs, mode, seqs, aging):
    """Priority p, queued at iteration q: the key is p * aging + q, and a request queued later than
    h = q + p * aging has a larger one, so it never overtakes. After h, then, the S slots can be held
    only by requests ranked ahead (`ahead` of them, all queued by h) or already running at h, and each
    holds its slot at most L iterations (L: the longest output; pool and token budget hold everyone,
    so a prompt runs in one iteration and no one is preempted). So a request starts by
    h + 1 + (S + ahead) * L // S, and every iteration it waits after h has its slots so held (in
    continuous mode all S of them). Without aging, class-0 arrivals after h take the slots first."""
    cfg = SchedulerConfig(mode=mode, policy=Policy.PRIORITY, max_num_seqs=seqs, max_num_batched_tokens=seqs * 17,
                          aging_iterations=aging)
    reqs = build_requests(specs)
    clock = SimClock()
    res = Engine(Scheduler(cfg, BlockManager(seqs * 32, 1)), SimulatedRunner(clock), clock,
                 keep_membership=True).run(reqs)
    assert len(res.membership) == res.iterations  # one row per iteration: none ran idle
    longest = max(s.output_tokens for s in specs)

    def key(r):  # the rank priority with aging gives (written out here, not taken from policies.sort_key)
        return r.priority * aging + r.enqueued_iteration, r.arrival_ns, r.request_id

    by_id = {r.request_id: r for r in reqs}
    for r in reqs:
        assert r.phase is Phase.FINISHED_LENGTH and r.num_preemptions == 0
        horizon = r.enqueued_iteration + r.priority * aging  # enqueued_iteration: its arrival (no preemption)
        started = r.first_scheduled_iteration
        for t in range(horizon + 1, started):
            holders = [by_id[i] for i in res.membership[t]]
            assert all(key(x) < key(r) or x.first_scheduled_iteration <= horizon for x in holders), (r.request_id, t)
            assert len(holders) == seqs or (mode is Mode.STATIC and all(
                x.first_scheduled_iteration <= horizon for x in holders)), (r.request_id, t)
        ahead = sum(key(x) < key(r) for x in reqs)
        assert started <= horizon + 1 + (seqs + ahead) * longest // seqs, (r.request_id, ahead)
        assert r.transitions[-1].iteration == started + r.sampling.max_tokens - 1
