"""Iterations run in bulk (profiler/bulk.py) give what a pass of the loop each gives.

Two computations of the same run: the engine with bulk runs on and off. Their run logs (every row
of the iteration, event and request tables), the requests' final state and the run's summary must be
identical, under random workloads, budgets, KV pressure, preemption kinds, arrivals, cancellations
and stop tokens.
"""
from __future__ import annotations

import hashlib
import random
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler_properties import configs, requests

from itertrace.profiler.scheduling.batch import Batch, SamplingParams
from itertrace.profiler.clock import SimClock
from itertrace.profiler.engine import Engine, NoProgress
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import Policy
from itertrace.profiler.tracing.nvtx_ranges import Tracer, tokens_text
from itertrace.profiler.scheduling.request import PreemptKind
from itertrace.profiler.tracing.runlog import RunLog
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.session import RunSpec, run
from itertrace.profiler.runners.sim_runner import CostModel, SimulatedRunner
from itertrace.profiler.workloads import RequestSpec, build_requests, synthetic


class _Marks(Tracer):
    """Keeps every NVTX mark it emits (arrive, admit, finish, tokens) in order."""

    def __init__(self, clock) -> None:
        super().__init__(clock)
        self.kept: list[tuple] = []

    def mark(self, name, request_id) -> None:
        self.kept.append((name, request_id))
        super().mark(name, request_id)

    def tokens(self, iteration, added, removed) -> None:
        self.kept.append((iteration, tokens_text(added, removed)))
        super().tokens(iteration, added, removed)


def _run(specs, cfg, num_blocks, block_size, swap_blocks, sampling, ignore_eos, bulk, cost=None):
    reqs = build_requests(specs, sampling=sampling, ignore_eos=ignore_eos)
    clock = SimClock()
    blocks = BlockManager(num_blocks, block_size, swap_blocks)
    tracer = _Marks(clock)
    engine = Engine(Scheduler(cfg, blocks),
                    SimulatedRunner(clock, cost), clock, keep_membership=True, keep_tokens=True,
                    bulk=bulk, tracer=tracer)
    with tempfile.TemporaryDirectory() as tmp:
        engine.log = RunLog(Path(tmp))
        result = engine.run(reqs)
        engine.log.close({})
        tables = {name: pq.read_table(Path(tmp) / f"{name}.parquet") for name in ("iterations", "events", "requests")}
    state = [(r.phase, r.output_ids, r.num_computed, r.block_ids, r.transitions, r.num_preemptions) for r in reqs]
    state.append(blocks.device.free_ids())  # its order says which blocks each request held, in which order
    state.append(tracer.kept)
    times = {rid: (t.first_token_ns, t.last_token_ns, t.finish_ns, t.token_ns, t.token_iterations)
             for rid, t in result.times.items()}
    summary = (result.iterations, result.idle_slot_iterations, result.idle_finished, result.idle_while_queued,
               result.end_ns, result.membership)
    return tables, state, times, summary, result.iterations_in_bulk, result.iterations_chained


def _assert_same(slow, fast) -> None:
    for name, table in slow[0].items():
        assert fast[0][name].equals(table), f"{name} table differs"
    assert fast[1:4] == slow[1:4]
    assert slow[4] == slow[5] == 0


# longer outputs than the invariant tests' so that runs have stretches worth running in bulk
long_requests = st.lists(
    st.builds(RequestSpec, arrival_ns=st.integers(0, 300_000_000), prompt_tokens=st.integers(1, 60),
              output_tokens=st.integers(1, 120), priority=st.integers(0, 2),
              cancel_at_iteration=st.one_of(st.none(), st.none(), st.none(), st.integers(0, 300))),
    min_size=1, max_size=20)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.one_of(requests, long_requests), cfg=configs, num_blocks=st.integers(1, 64),
       block_size=st.sampled_from([1, 4, 16]), swap_blocks=st.integers(0, 12),
       stops=st.lists(st.integers(32, 126), max_size=3), ignore_eos=st.booleans())
def test_bulk_runs_give_the_same_run(specs, cfg, num_blocks, block_size, swap_blocks, stops, ignore_eos):
    sampling = SamplingParams(stop_token_ids=tuple(stops)) if stops else None
    args = (specs, cfg, num_blocks, block_size, swap_blocks, sampling, ignore_eos)
    _assert_same(_run(*args, bulk=False), _run(*args, bulk=True))


def test_a_steady_run_skips_most_iterations_and_stays_the_same():
    """The default workload's shape: 16 slots, every request 128 tokens. Non-integer cost coefficients (the
    host's time too, charged in prepare), so the per-iteration times go through float rounding in both
    computations."""
    specs = [RequestSpec(0, 100, 128) for _ in range(48)] + [RequestSpec(5_000_000_000, 7, 300)]
    cost = CostModel(fixed_ns=1_234_567.5, per_seq_ns=3_333.3, per_token_ns=45_678.9, per_context_token_ns=77.7,
                     host_ns=456_789.6)
    args = (specs, SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512), 4096, 16, 0, None, True)
    slow, fast = _run(*args, bulk=False, cost=cost), _run(*args, bulk=True, cost=cost)
    _assert_same(slow, fast)
    iterations = slow[3][0]
    assert fast[4] > 0.9 * iterations, (fast[4], iterations)


def test_kv_running_short_within_a_bulk_stretch():
    """Every pool size from too small to ample: the stretch must stop exactly where the pool runs short
    (that iteration preempts), and the blocks must be the same ones, taken in the same order."""
    specs = [RequestSpec(0, 3, 30), RequestSpec(0, 5, 45), RequestSpec(0, 9, 60)]
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    skipped = 0
    for block_size in (1, 2, 4):
        for num_blocks in range(69 // block_size // 2, 120 // block_size):
            args = (specs, cfg, num_blocks, block_size, 0, None, True)
            slow, fast = _run(*args, bulk=False), _run(*args, bulk=True)
            _assert_same(slow, fast)
            skipped += fast[4]
    assert skipped > 1000


def test_a_request_refused_for_blocks_or_budget_waits_through_bulk_stretches():
    """The queue's head cannot start for want of KV blocks (or, chunked prefill off, of token budget) while
    slots are free: the rows run in bulk meanwhile, and it starts in the same iteration as one by one."""
    cases = [  # (requests, config, blocks, block size)
        # three rows grow to 66 of the 67 blocks; the fourth, arriving at iteration 54, needs 25 for its prompt
        ([RequestSpec(0, 8, 80) for _ in range(3)] + [RequestSpec(440_000_000, 100, 5)],
         SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128), 67, 4),
        # six decodes leave 58 of 64 tokens; the seventh's 60-token prompt may not be chunked
        ([RequestSpec(0, 8, 90) for _ in range(6)] + [RequestSpec(0, 60, 5)],
         SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, chunked_prefill=False), 200, 4),
    ]
    for specs, cfg, num_blocks, block_size in cases:
        args = (specs, cfg, num_blocks, block_size, 0, None, True)
        slow, fast = _run(*args, bulk=False), _run(*args, bulk=True)
        _assert_same(slow, fast)
        iterations = slow[0]["iterations"].to_pylist()
        waited = [r for r in iterations if r["num_waiting"] and r["slots_empty"] and not r["admitted"]]
        assert len(waited) > 20, cfg
        assert fast[4] > 0.5 * len(waited)


def test_an_arrival_at_an_iteration_start_joins_that_iteration():
    """A request arriving exactly when an iteration run in bulk would start is taken in at that iteration."""
    first = [RequestSpec(0, 8, 50), RequestSpec(0, 8, 60)]
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    tables = _run(first, cfg, 64, 4, 0, None, True, bulk=False)[0]
    start = tables["iterations"]["start_ns"].to_pylist()[20]
    args = (first + [RequestSpec(start, 4, 10)], cfg, 64, 4, 0, None, True)
    slow, fast = _run(*args, bulk=False), _run(*args, bulk=True)
    _assert_same(slow, fast)
    arrive = [e for e in fast[0]["events"].to_pylist() if e["request_id"] == 2 and e["kind"] == "arrive"]
    assert arrive[0]["iteration"] == 20 and arrive[0]["ts_ns"] == start
    assert fast[4] > 40


def test_a_reservation_shrinks_as_a_row_takes_blocks_within_a_bulk_stretch():
    """Preemption mode "reject": a is promised 6 blocks of 4 (4 + 20 tokens) and takes its 3rd and 4th at
    iterations 5 and 9, inside a stretch run in bulk; b (3 blocks) arrives at iteration 11, when 6 of the 10 are
    free and 2 promised to a. A stretch that left a's promise at 4 would reject b, which one by one admits."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, preemption=PreemptKind.REJECT)
    first = [RequestSpec(0, 4, 20)]
    start = _run(first, cfg, 10, 4, 0, None, True, bulk=False)[0]["iterations"]["start_ns"].to_pylist()[11]
    args = (first + [RequestSpec(start, 4, 8)], cfg, 10, 4, 0, None, True)
    slow, fast = _run(*args, bulk=False), _run(*args, bulk=True)
    b = [e for e in slow[0]["events"].to_pylist() if e["request_id"] == 1 and e["kind"] in ("admit", "reject")]
    assert [(e["iteration"], e["kind"]) for e in b] == [(11, "admit")]
    _assert_same(slow, fast)
    assert fast[4] >= 9  # iterations 1-9 at least ran at once


def test_a_prompt_that_preempts_itself_again_and_again_gives_the_same_run():
    """The thrash of a full pool: two rows decode while a long prompt is admitted, runs a few chunks, finds no
    block for its next one and preempts itself (recompute), resumes, ... until a row finishes. The first such
    preemption runs right after the stretch of its chunks (bulk.InBulk.preempting), the cycles after it as a
    chain (profiler/thrash.py): the same rows (times, kv_allocated, kv_freed, kv_in_use among them), events,
    blocks, in the same order, and tallies as one by one; with costs that go through float rounding, the rows
    taking blocks in every iteration (block size 1), a request arriving in the middle of the thrash (at an
    iteration's start, and just after it) and a row canceled in it."""
    cost = CostModel(fixed_ns=1_234_567.5, per_seq_ns=3_333.3, per_token_ns=45_678.9, per_context_token_ns=77.7,
                     host_ns=456_789.6)
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    specs = [RequestSpec(0, 8, 200), RequestSpec(0, 8, 160), RequestSpec(0, 300, 20), RequestSpec(0, 40, 30)]
    for block_size, num_blocks in ((4, 90), (1, 380), (2, 180)):
        starts = _run(specs, cfg, num_blocks, block_size, 0, None, True, bulk=False)[0]["iterations"]["start_ns"]
        for extra, cancel in (([], None), ([RequestSpec(starts[60].as_py(), 5, 5)], None),
                              ([RequestSpec(starts[61].as_py() + 1, 5, 5)], 75), (None, None)):
            # (None: the prompt alone behind the rows: no one else queued while it runs)
            others = specs[3:] + extra if extra is not None else []
            workload = [RequestSpec(0, 8, 200, cancel_at_iteration=cancel), *specs[1:3], *others]
            args = (workload, cfg, num_blocks, block_size, 0, None, True)
            slow, fast = _run(*args, bulk=False, cost=cost), _run(*args, bulk=True, cost=cost)
            _assert_same(slow, fast)
            rows = slow[0]["iterations"].to_pylist()
            preempting = [r for r in rows if r["preempted"] and r["prefill_tokens"] == 0 and r["kv_freed"]]
            assert len(preempting) > 30 and fast[5] > 2.5 * len(preempting), (block_size, len(preempting), fast[5])
            if block_size == 1:  # every row takes a block in every iteration, those that preempt among them
                assert all(r["kv_allocated"] == r["num_seqs"] for r in preempting)


def test_random_workloads_in_a_pool_too_small_give_the_same_run():
    """Random workloads whose KV pool holds a sixth to a half of what they need, so that long prompts thrash,
    under every policy, both preemption kinds that give blocks back, chunked prefill on and off, a decode
    reserve, stop tokens, cancels and arrivals: in bulk (chains among them) as one by one."""
    chained = 0
    for seed in range(60):
        rng = random.Random(seed)
        block_size = rng.choice([1, 2, 4, 8])
        specs = [RequestSpec(rng.choice([0, 0, rng.randint(0, 300_000_000)]), rng.randint(1, 400),
                             rng.randint(1, 150), priority=rng.randint(0, 2),
                             cancel_at_iteration=rng.choice([None] * 6 + [rng.randint(0, 300)]))
                 for _ in range(rng.randint(2, 9))]
        blocks = [-(-(spec.prompt_tokens + spec.output_tokens) // block_size) for spec in specs]
        num_blocks = max(rng.randint(sum(blocks) // 6, sum(blocks) // 2), max(blocks))
        cfg = SchedulerConfig(max_num_seqs=rng.choice([2, 3, 4, 6, 8]),
                              max_num_batched_tokens=rng.choice([32, 48, 64, 100]), policy=rng.choice(list(Policy)),
                              decode_reserve=rng.choice([0.0, 0.0, 0.1]), chunked_prefill=rng.random() < 0.8,
                              preemption=rng.choice([PreemptKind.RECOMPUTE] * 4 + [PreemptKind.SWAP]))
        stops = rng.choice([(), (), (40, 77)])
        sampling = SamplingParams(stop_token_ids=stops) if stops else None
        args = (specs, cfg, num_blocks, block_size, rng.choice([0, 20]), sampling, not stops)
        try:
            slow = _run(*args, bulk=False)
        except NoProgress:  # (chunked prefill off: a recompute can outgrow what an iteration holds)
            continue
        fast = _run(*args, bulk=True)
        _assert_same(slow, fast)
        chained += fast[5]
    assert chained > 300


# digests of the rows of the run below, one by one, as the engine made them before its one-by-one path
# was made cheaper (batches joining block tables when read, the pool taking blocks a request at a time,
# decode rows counting down to their next finish and block): every row the same. Only a change meant to
# change what the engine does may change them.
_LONG_PROMPT_ROWS = {PreemptKind.RECOMPUTE: "a81a1e9ce6248b7a", PreemptKind.SWAP: "aebb382edf4b2845"}


def test_long_prompts_arriving_into_a_full_kv_pool_give_the_same_run():
    """A production trace of long prompts, scaled down: arrivals every few iterations, prompts chunked over
    several, a KV pool too small for them all, so that requests are preempted mid-prompt and recompute (or
    swap) again and again between stretches run in bulk. In bulk and one by one give the same run, and
    its rows are the ones the engine has always made for it."""
    for preemption, swap_blocks in ((PreemptKind.RECOMPUTE, 0), (PreemptKind.SWAP, 64)):
        specs = synthetic(60, rate=20.0, prompt="uniform:200:1200", output="uniform:20:120", seed=3)
        cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, preemption=preemption)
        args = (specs, cfg, 256, 16, swap_blocks, None, True)
        slow, fast = _run(*args, bulk=False), _run(*args, bulk=True)
        _assert_same(slow, fast)
        rows = slow[0]["iterations"].to_pylist()
        assert sum(r["preempted"] for r in rows) > 40 and sum(r["prefill_tokens"] > 0 for r in rows) > 150
        assert fast[4] > 250
        if preemption is PreemptKind.RECOMPUTE:  # more than the iterations without a prompt chunk: chunks ran in bulk
            assert fast[4] > sum(r["prefill_tokens"] == 0 for r in rows)
        digest = hashlib.sha256()
        for name in ("iterations", "events", "requests"):
            digest.update(repr(slow[0][name].to_pylist()).encode())
        assert digest.hexdigest()[:16] == _LONG_PROMPT_ROWS[preemption]


def test_progress_is_called_at_every_thousandth_iteration_as_one_by_one():
    calls = {}
    for bulk in (False, True):
        clock, seen = SimClock(), []
        Engine(Scheduler(SchedulerConfig(max_num_seqs=2), BlockManager(4096, 16)), SimulatedRunner(clock), clock,
               progress=lambda *call: seen.append(call), bulk=bulk).run(
            build_requests([RequestSpec(0, 4, 2500), RequestSpec(0, 4, 1200)]))
        calls[bulk] = seen
    assert calls[True] == calls[False] == [(1000, 2), (2000, 2)]


def test_no_bulk_runs_while_a_tool_records_nvtx(monkeypatch, tmp_path):
    """Under nsys every iteration keeps its own step range, so a capture numbers every iteration."""
    specs = [RequestSpec(0, 16, 64) for _ in range(4)]
    result = run(RunSpec(), build_requests(specs), run_dir=tmp_path / "plain")
    assert result.iterations_in_bulk > 0
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/nonexistent/libToolsInjection64.so")  # nvtx only reads it at load
    result = run(RunSpec(), build_requests(specs), run_dir=tmp_path / "recorded")
    assert result.iterations_in_bulk == 0 and result.iterations > 60


def test_decode_steps_match_forward_and_sample_one_by_one():
    """The runner's closed forms against its own per-iteration path, on a batch moved one position at a time."""
    cost = CostModel(fixed_ns=2e6 / 3, per_seq_ns=1e4 / 7, per_token_ns=4.5e4 / 11, per_context_token_ns=0.1)
    runner = SimulatedRunner(SimClock(), cost)
    ids, pos, gen = np.array([3, 17, 4]), np.array([40, 7, 1000]), np.array([5, 1, 300])
    host_ns, times = runner.decode_times(_decode_batch(ids, pos, gen), 50)
    assert host_ns == 0
    tokens = runner.decode_tokens(_decode_batch(ids, pos, gen), 50)
    for step in range(50):
        batch = _decode_batch(ids, pos + step, gen + step)
        assert times[step] == cost.forward_ns(batch)
        assert tokens[step].tolist() == runner.sample(batch, None).tolist()


def _decode_batch(ids, pos, gen) -> Batch:
    n = len(ids)
    return Batch(iteration=0, block_size=16, request_ids=ids, start_pos=pos, num_tokens=np.ones(n, dtype=np.int64),
                 token_ids=np.zeros(n, dtype=np.int64), sample=np.ones(n, dtype=bool),
                 block_tables=np.zeros((n, 1), dtype=np.int64), num_generated=gen,
                 sampling=(SamplingParams(),) * n)
