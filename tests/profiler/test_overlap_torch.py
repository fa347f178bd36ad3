"""Overlap mode on the torch runner: placeholders put in at launch, the forward pass on a device thread (on
the CPU), and greedy tokens the same as without overlap (on CUDA too, in test_cuda.py)."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overlap_checks import CheckedRunner
from test_scheduler_properties import kv_pressure
from test_torch_runner import BLOCK, SMALL, decode_batch

from itertrace.profiler.scheduling.batch import Batch, SamplingParams, SwapPlan
from itertrace.profiler.clock import WallClock
from itertrace.profiler.engine import Engine
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.runners.torch.launcher import Launcher
from itertrace.profiler.runners.torch.model import ModelConfig
from itertrace.profiler.scheduling.request import Phase, PreemptKind
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.runners.torch.torch_runner import TorchRunner
from itertrace.profiler.workloads import build_requests, worked_example

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One CPU thread, as `itertrace run` uses: torch's thread per core slows down many times over beside
    other processes on these cores (README), and overlap mode adds the device thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Where:
    """An on_device context that notes the thread it is entered on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __enter__(self) -> None:
        self.threads.append(threading.current_thread().name)

    def __exit__(self, *exc) -> None:
        pass


def _mixed(tokens: list[int]) -> Batch:
    """A prefill chunk of 3 tokens (request 0) beside a decode (request 1), in blocks 0-1 and 2."""
    return Batch(iteration=1, block_size=BLOCK, request_ids=np.array([0, 1]), start_pos=np.array([0, 2]),
                 num_tokens=np.array([3, 1]), token_ids=np.array(tokens), sample=np.array([True, True]),
                 block_tables=np.array([[0, 1], [2, -1]]), num_generated=np.array([0, 1]),
                 sampling=(SamplingParams(),) * 2)


@pytest.mark.parametrize("kind", ["decodes", "mixed"])
def test_placeholders_take_the_previous_tokens_at_launch(kind):
    """A batch whose token ids are placeholders (-1 - j: the j-th token of the iteration before) gives, once
    launched with those tokens, the logits of the same batch with the tokens written in; forward refuses it,
    and the batch's own array is never written."""
    previous = np.array([7, 19, 42])
    if kind == "decodes":
        tables = np.array([[0, -1], [1, -1]])
        make = lambda tokens: decode_batch(0, tokens, [3, 2], tables)  # noqa: E731
        written, held = [19, 7], [-2, -1]
    else:
        make = _mixed
        written, held = [5, 6, 8, 42], [5, 6, 8, -3]
    plain = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK, seed=3)
    expected = plain.forward(plain.prepare(make(written)))
    runner = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK, seed=3)
    batch = make(held)
    prepared = runner.prepare(batch)
    with pytest.raises(ValueError, match="placeholders"):
        runner.forward(prepared)
    where = _Where()
    runner.launch(prepared, SwapPlan(), previous, where)
    assert torch.equal(runner.collect(), expected)
    assert batch.token_ids.tolist() == held
    assert where.threads == ["itertrace-device_0"]
    with pytest.raises(ValueError, match="placeholders for 3 tokens of the previous iteration, 2 given"):
        runner.launch(runner.prepare(make(held if kind == "mixed" else [-3, -1])), SwapPlan(), previous[:2], where)


def test_prepare_writes_into_the_inputs_no_forward_pass_reads():
    """Two all-decode batches in a row while the first is on the device: the second is prepared into the other
    inputs, so the first runs on its own tokens and positions (its logits are those of running it alone)."""
    tables = np.array([[0, 1], [2, 3]])
    ones = np.ones(2, dtype=np.int64)
    first, second = decode_batch(0, [11, 12], [3, 2], tables, ones=ones), decode_batch(1, [13, 14], [4, 3], tables, ones=ones)
    alone = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK, seed=4)
    want = [alone.forward(alone.prepare(b)) for b in (first, second)]
    runner = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK, seed=4)
    prepared = runner.prepare(first)
    runner.launch(prepared, SwapPlan(), None, _Where())
    after = runner.prepare(second)  # while the first may still run
    assert after is not prepared
    assert torch.equal(runner.collect(), want[0])
    runner.launch(after, SwapPlan(), None, _Where())
    assert torch.equal(runner.collect(), want[1])


def test_a_chained_launch_takes_the_greedy_tokens_of_the_one_before_on_the_device():
    """Launched behind a forward pass in flight with no tokens given (`chains`: all rows greedy), a batch's
    placeholders get that pass's argmax on the device thread: both give the logits of running them one after
    the other with the tokens written in, and `sample` gives the argmax without the sampler."""
    tables, ones = np.array([[0, 1], [2, 3]]), np.ones(2, dtype=np.int64)
    first = decode_batch(0, [11, 12], [3, 2], tables, ones=ones)
    plain = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK, seed=6)
    want_first = plain.forward(plain.prepare(first))
    greedy = want_first.argmax(-1).tolist()
    want_second = plain.forward(plain.prepare(decode_batch(1, [greedy[1], greedy[0]], [4, 3], tables, ones=ones)))
    runner = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK, seed=6)
    assert runner.chains(first) and not runner.chains(replace(first, sampling=(SamplingParams(temperature=1.0),) * 2))
    runner.launch(runner.prepare(first), SwapPlan(), None, _Where())
    runner.launch(runner.prepare(decode_batch(1, [-2, -1], [4, 3], tables, ones=ones)), SwapPlan(), None, _Where())
    got_first = runner.collect()
    assert torch.equal(got_first, want_first)
    assert runner.sample(first, got_first).tolist() == greedy
    assert torch.equal(runner.collect(), want_second)


def test_a_result_is_known_once_the_pass_queued_behind_it_reaches_its_forward():
    """On the CPU the device thread makes N's result known only when the work queued behind it calls the
    function it is given (just before its forward pass), so the host never wakes while the device thread
    still needs the GIL to start N+1; with nothing queued, at once."""
    launcher, gate, events = Launcher(torch.device("cpu")), threading.Event(), []

    def first(ready):
        gate.wait()
        return "first"

    def second(ready):
        events.append("second reaches its forward pass")
        ready()
        return "second"

    launcher.launch(first, _Where(), None)
    launcher.launch(second, _Where(), None)  # queued behind the first
    gate.set()
    assert launcher.collect() == "first"
    events.append("first collected")
    assert events == ["second reaches its forward pass", "first collected"]
    assert launcher.collect() == "second"
    with pytest.raises(RuntimeError, match="no forward pass was launched"):
        launcher.collect()


def _torch_run(specs, cfg, *, overlap, num_blocks, block_size=4, swap_blocks=0, sampling=None, config=TINY):
    reqs = build_requests(specs, seed=5, sampling=sampling, ignore_eos=sampling is None)
    blocks = BlockManager(num_blocks, block_size, swap_blocks)
    runner = TorchRunner(config, num_blocks=num_blocks, block_size=block_size, swap_blocks=swap_blocks,
                         device="cpu", seed=5)
    result = Engine(Scheduler(cfg, blocks), CheckedRunner(runner, blocks, reqs), WallClock(), overlap=overlap).run(reqs)
    assert blocks.device.num_free == num_blocks and all(r.phase.terminal for r in reqs)
    return reqs, result


def test_the_worked_example_gives_the_same_tokens_with_overlap():
    """The worked example on the default model (the demo's), greedy: token for token the same."""
    specs = worked_example()
    cfg = SchedulerConfig(max_num_seqs=8)
    plain, _ = _torch_run(specs, cfg, overlap=False, num_blocks=512, block_size=16, config=ModelConfig())
    ahead, result = _torch_run(specs, cfg, overlap=True, num_blocks=512, block_size=16, config=ModelConfig())
    assert [r.output_ids for r in ahead] == [r.output_ids for r in plain]
    assert [len(r.output_ids) for r in ahead] == [s.output_tokens for s in specs] and result.tokens_dropped == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preemption=st.sampled_from([PreemptKind.RECOMPUTE, PreemptKind.SWAP]), stop=st.booleans(), data=st.data())
def test_greedy_tokens_are_the_same_with_overlap(preemption, stop, data):
    """Random workloads under KV pressure (test_scheduler_properties.kv_pressure: preemption by recompute or
    swap), with cancels and stop tokens: requests that finish both ways get the same tokens, a canceled one a
    prefix of the other's; every batch checked. All arrive at once, so that the schedule does not depend on
    the wall clock; a stop token is a token the model gives without it, so that requests do stop."""
    specs, cfg, num_blocks, block_size, swap_blocks = data.draw(kv_pressure(preemption))
    specs = [replace(s, arrival_ns=0) for s in specs]
    kw = dict(num_blocks=num_blocks, block_size=block_size, swap_blocks=swap_blocks)
    sampling = None
    if stop:
        probe, _ = _torch_run(specs, cfg, overlap=False, **kw)
        outputs = [t for r in probe for t in r.output_ids[1:]]
        if outputs:
            sampling = SamplingParams(stop_token_ids=(data.draw(st.sampled_from(outputs)),))
    plain, _ = _torch_run(specs, cfg, overlap=False, sampling=sampling, **kw)
    ahead, _ = _torch_run(specs, cfg, overlap=True, sampling=sampling, **kw)
    for a, b in zip(plain, ahead):
        if a.phase in (Phase.FINISHED_LENGTH, Phase.FINISHED_STOP) and b.phase in (Phase.FINISHED_LENGTH,
                                                                                Phase.FINISHED_STOP):
            assert (b.phase, b.output_ids) == (a.phase, a.output_ids), a.request_id
        else:
            short, long = sorted((a.output_ids, b.output_ids), key=len)
            assert long[:len(short)] == short, a.request_id
