"""Property-based tests: random arrivals, cancellations and KV pressure under every mode and policy.

At every iteration: budgets hold, no KV block is shared or dangling, and the pool's books balance.
At the end: every request is in exactly one terminal state, none is lost, every block is back.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from itertrace.profiler.clock import SimClock
from itertrace.profiler.engine import Engine
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.policies import Policy
from itertrace.profiler.request import Phase, PreemptKind, Reason
from itertrace.profiler.runlog import RunLog
from itertrace.profiler.scheduler import Mode, Scheduler, SchedulerConfig
from itertrace.profiler.sim_runner import SimulatedRunner
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

    # every request ends in exactly one terminal state; none is lost
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
