"""Overlap mode (profiler/overlap.py) against the engine without it, on the simulated runner.

The known failures of the engines that scheduled one step ahead first are the cases: a request
scheduled past its max_tokens; a token computed after a stop token, or after a cancel, emitted or
counted; blocks freed while the device still reads them, or a block table naming a block another
request holds (CheckedRunner checks both on every batch); preemption with a step in flight. Every
run here is checked by CheckedRunner, and compared with the same run without overlap: requests
that finish in both runs have the same tokens (a request's tokens do not depend on its batch), and
a canceled or rejected one has, in one run, a prefix of its tokens in the other (overlap shifts the
iterations at which cancels and admissions land).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overlap_checks import CheckedRunner
from test_scheduler_properties import configs, kv_pressure, requests

from itertrace.profiler.scheduling.batch import SamplingParams
from itertrace.profiler.clock import SimClock
from itertrace.profiler.engine import Engine
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.request import Phase, PreemptKind
from itertrace.profiler.tracing.runlog import RunLog
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.session import RunSpec, run
from itertrace.profiler.runners.sim_runner import CostModel, SimulatedRunner
from itertrace.profiler.workloads import RequestSpec, build_requests

DONE = (Phase.FINISHED_LENGTH, Phase.FINISHED_STOP)


@dataclass
class Run:
    requests: list
    result: object
    iterations: list[dict]
    events: list[dict]
    runner: CheckedRunner


def _run(specs, cfg, *, overlap, num_blocks=4096, block_size=4, swap_blocks=0, sampling=None, cost=None,
         wrap=CheckedRunner) -> Run:
    reqs = build_requests(specs, sampling=sampling, ignore_eos=sampling is None)
    clock, blocks = SimClock(), BlockManager(num_blocks, block_size, swap_blocks)
    runner = wrap(SimulatedRunner(clock, cost), blocks, reqs)
    with tempfile.TemporaryDirectory() as tmp:
        log = RunLog(Path(tmp))
        result = Engine(Scheduler(cfg, blocks), runner, clock, log=log, overlap=overlap).run(reqs)
        log.close({})
        iterations = pq.read_table(Path(tmp) / "iterations.parquet").to_pylist()
        events = pq.read_table(Path(tmp) / "events.parquet").to_pylist()
    assert all(r.phase.terminal for r in reqs)
    assert blocks.device.num_free == num_blocks and blocks.swap.num_free == swap_blocks
    return Run(reqs, result, iterations, events, runner)


def _assert_like_without_overlap(plain: Run, ahead: Run) -> None:
    """Same tokens where both finished, prefixes otherwise; the overlap run's logs tell each story once."""
    for a, b in zip(plain.requests, ahead.requests):
        if a.phase in DONE and b.phase in DONE:
            assert (b.phase, b.output_ids) == (a.phase, a.output_ids), a.request_id
        else:
            short, long = sorted((a.output_ids, b.output_ids), key=len)
            assert long[:len(short)] == short, a.request_id
    _assert_stories(ahead)


def _assert_stories(r: Run) -> None:
    """Per request: arrive first, one terminal event last, a token event per output token (the dropped ones
    nowhere), none after its finish or cancel; the log's dropped tokens add up to the run's."""
    by_request: dict[int, list[dict]] = {}
    for ev in r.events:
        by_request.setdefault(ev["request_id"], []).append(ev)
    for req in r.requests:
        evs = by_request[req.request_id]
        kinds = [e["kind"] for e in evs]
        assert kinds[0] == "arrive" and kinds[-1] in ("finish", "cancel", "reject"), (req.request_id, kinds)
        assert sum(k in ("finish", "cancel", "reject") for k in kinds) == 1
        tokens = [e for e in evs if e["kind"] in ("first_token", "token")]
        assert len(tokens) == len(req.output_ids), req.request_id
        assert kinds.count("first_token") == (1 if req.output_ids else 0)
        if req.phase in DONE:
            assert req.transitions[-1].iteration == max(e["iteration"] for e in tokens)
    assert sum(row["dropped_tokens"] for row in r.iterations) == r.result.tokens_dropped


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=requests, cfg=configs, num_blocks=st.integers(1, 48), block_size=st.sampled_from([1, 4, 16]),
       swap_blocks=st.integers(0, 12), stops=st.lists(st.integers(32, 126), max_size=4))
def test_overlap_gives_the_tokens_of_the_engine_without_it(specs, cfg, num_blocks, block_size, swap_blocks, stops):
    sampling = SamplingParams(stop_token_ids=tuple(stops)) if stops else None
    kw = dict(num_blocks=num_blocks, block_size=block_size, swap_blocks=swap_blocks, sampling=sampling)
    _assert_like_without_overlap(_run(specs, cfg, overlap=False, **kw), _run(specs, cfg, overlap=True, **kw))


@pytest.mark.parametrize("preemption", list(PreemptKind))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), stops=st.lists(st.integers(32, 126), max_size=4))
def test_overlap_under_kv_pressure(preemption, data, stops):
    """Preemptions (vLLM #47900: a placeholder count went negative), swaps and refusals with a step on the device:
    the same tokens, the checks on every batch, no negative count in any row."""
    specs, cfg, num_blocks, block_size, swap_blocks = data.draw(kv_pressure(preemption))
    sampling = SamplingParams(stop_token_ids=tuple(stops)) if stops else None
    kw = dict(num_blocks=num_blocks, block_size=block_size, swap_blocks=swap_blocks, sampling=sampling)
    ahead = _run(specs, cfg, overlap=True, **kw)
    _assert_like_without_overlap(_run(specs, cfg, overlap=False, **kw), ahead)
    counts = ("kv_allocated", "kv_freed", "kv_in_use", "num_waiting", "num_preempted", "dropped_tokens")
    assert all(row[c] >= 0 for row in ahead.iterations for c in counts)


def test_preemption_with_a_step_in_flight_happens_and_changes_no_token():
    """Six requests that the pool holds one or two at a time: requests are preempted while their last iteration
    is on the device, in every preemption kind, and all get the tokens they get without overlap."""
    specs = [RequestSpec(0, 6 + i, 20 + 3 * i) for i in range(6)]
    for kind, swap_blocks in ((PreemptKind.RECOMPUTE, 0), (PreemptKind.SWAP, 40)):
        cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64, preemption=kind)
        kw = dict(num_blocks=24, block_size=2, swap_blocks=swap_blocks)
        plain, ahead = _run(specs, cfg, overlap=False, **kw), _run(specs, cfg, overlap=True, **kw)
        assert sum(r.num_preemptions for r in ahead.requests) >= 3, kind
        assert [r.output_ids for r in ahead.requests] == [r.output_ids for r in plain.requests]
        assert all(r.phase is Phase.FINISHED_LENGTH for r in ahead.requests)


def test_no_request_is_scheduled_past_its_max_tokens():
    """vLLM #27922, SGLang #18301: with iteration N on the device, N+1 is scheduled before N's tokens are in;
    a request whose last token N computes must not be in N+1. CheckedRunner refuses a row past max_tokens;
    nothing is computed to be dropped (no stop tokens, no cancels)."""
    specs = [RequestSpec(0, 5, n) for n in (1, 2, 3, 7, 16)] + [RequestSpec(30_000_000, 3, 1)]
    r = _run(specs, SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), overlap=True)
    assert [len(q.output_ids) for q in r.requests] == [1, 2, 3, 7, 16, 1]
    assert r.result.tokens_dropped == 0 and r.runner.batches == r.result.iterations


def test_a_stop_token_drops_the_token_computed_after_it():
    """Request 0's simulated tokens are 32, 33, ...: with 37 a stop token it stops at its 6th token, in iteration
    5 (its prompt runs in iteration 0). Iteration 6 was scheduled, with a new KV block for it (blocks of one
    token), before that was known: its token there is dropped (never emitted, no event, not in its output, not
    in TTFT/TPOT), the iteration's row says so, and the block goes back once iteration 6 is done
    (CheckedRunner). Request 1, beside it, never stops."""
    specs = [RequestSpec(0, 4, 20), RequestSpec(0, 4, 10)]
    sampling = SamplingParams(stop_token_ids=(37,))
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    plain = _run(specs, cfg, overlap=False, block_size=1, num_blocks=64, sampling=sampling)
    ahead = _run(specs, cfg, overlap=True, block_size=1, num_blocks=64, sampling=sampling)
    stopped = ahead.requests[0]
    assert stopped.phase is Phase.FINISHED_STOP and stopped.output_ids == [32, 33, 34, 35, 36, 37]
    assert stopped.transitions[-1].iteration == 5
    assert ahead.result.tokens_dropped == 1
    assert [(row["iteration"], row["dropped_tokens"]) for row in ahead.iterations if row["dropped_tokens"]] == [(6, 1)]
    assert 0 in ahead.iterations[6]["scheduled_ids"]
    tokens = [(e["iteration"], e["kind"]) for e in ahead.events if e["request_id"] == 0 and "token" in e["kind"]]
    assert tokens == [(0, "first_token")] + [(i, "token") for i in range(1, 6)]
    assert ahead.result.times[0].first_token_ns == plain.result.times[0].first_token_ns  # no host time: equal clocks
    assert ahead.result.times[0].last_token_ns == ahead.iterations[5]["end_ns"]
    _assert_like_without_overlap(plain, ahead)


class _CancelWatch(CheckedRunner):
    """Also notes, for request 1, how many forward passes had been collected when its blocks went back."""

    def __init__(self, inner, blocks, reqs) -> None:
        super().__init__(inner, blocks, reqs)
        self.collected, self.freed_after = 0, []
        give_back = blocks.device.give_back

        def watch(owner, returned):
            if owner == 1:
                self.freed_after.append(self.collected)
            give_back(owner, returned)

        blocks.device.give_back = watch

    def collect(self):
        logits = super().collect()
        self.collected += 1
        return logits

    def forward(self, prepared):
        logits = super().forward(prepared)
        self.collected += 1
        return logits


def test_a_cancel_while_the_next_iteration_is_prepared():
    """Request 1 is canceled at iteration 8's boundary, while iteration 7 is on the device: it gets no token after
    the cancel (iteration 7's is dropped), and its blocks go back only after iteration 7 is done (8 passes
    collected), not when the cancel comes. Without overlap, iteration 7 was done before the cancel: one token more."""
    specs = [RequestSpec(0, 4, 30), RequestSpec(0, 4, 30, cancel_at_iteration=8)]
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    plain = _run(specs, cfg, overlap=False, wrap=_CancelWatch)
    ahead = _run(specs, cfg, overlap=True, wrap=_CancelWatch)
    canceled = ahead.requests[1]
    assert canceled.phase is Phase.CANCELED and canceled.transitions[-1].iteration == 8
    assert len(plain.requests[1].output_ids) == 8 and len(canceled.output_ids) == 7
    assert ahead.result.tokens_dropped == 1
    assert [row["dropped_tokens"] for row in ahead.iterations][7] == 1
    assert plain.runner.freed_after == [8] and ahead.runner.freed_after == [8]
    cancel_ts = next(e["ts_ns"] for e in ahead.events if e["request_id"] == 1 and e["kind"] == "cancel")
    assert all(e["ts_ns"] <= cancel_ts for e in ahead.events if e["request_id"] == 1 and "token" in e["kind"])
    _assert_like_without_overlap(plain, ahead)


def test_the_simulated_iteration_takes_the_longer_of_host_and_device():
    """One request decoding: without overlap a device start follows the last one by host + device time, with
    overlap by the larger of the two, for a host time below and above the device's."""
    cost = lambda host_ns: CostModel(fixed_ns=1_000_000, per_token_ns=0, per_context_token_ns=1000,  # noqa: E731
                                     host_ns=host_ns)
    specs = [RequestSpec(0, 200, 40)]
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=256)
    for host_ns in (400_000, 1_500_000):
        for overlap in (False, True):
            rows = _run(specs, cfg, overlap=overlap, cost=cost(host_ns)).iterations
            for a, b in zip(rows[1:], rows[2:]):  # decodes: device time 1 ms + 1 us per context token
                device_ns = 1_000_000 + 1000 * (200 + b["iteration"])
                assert b["forward_ns"] == device_ns
                step = max(host_ns, a["forward_ns"]) if overlap else host_ns + a["forward_ns"]
                assert b["device_start_ns"] - a["device_start_ns"] == step, (host_ns, overlap, b["iteration"])


def test_overlap_reaches_the_run_directory(tmp_path):
    """`overlap` in the run's configuration, the forward intervals in the iteration log in order and apart, the
    phases' own times (which overlap the neighbours' steps), dropped tokens in the summary."""
    import json

    specs = [RequestSpec(0, 8, 12) for _ in range(3)]
    result = run(RunSpec(overlap=True, cost=CostModel(host_ns=2_000_000)), build_requests(specs), run_dir=tmp_path)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["config"]["overlap"] is True and meta["summary"]["tokens_dropped"] == 0
    assert result.iterations_in_bulk == 0 and result.iterations == 12
    rows = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    starts, ends = np.array([r["device_start_ns"] for r in rows]), np.array([r["device_end_ns"] for r in rows])
    assert (ends > starts).all() and (starts[1:] >= ends[:-1]).all()
    assert all(r["prepare_ns"] == 2_000_000 for r in rows)
    assert all(a["end_ns"] > b["start_ns"] for a, b in zip(rows, rows[1:]))  # steps overlap
