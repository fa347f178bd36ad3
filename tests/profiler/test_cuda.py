"""The torch runner on CUDA against the same runner on the CPU, batch for batch (skipped without a GPU).

One scheduler drives both runners in lockstep: every batch it hands out (prefill chunks, mixed
batches, the all-decode fast path with block tables grown in place, swaps under KV pressure) goes
through a CPU runner and a CUDA runner built from the same seed, and their logits must agree within
1e-4. Tokens are sampled from the CPU logits, so both runners see the same batches
for the whole run even where a near-tie would let greedy argmax differ.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from itertrace.profiler.scheduling.batch import Batch, SamplingParams, SwapPlan
from itertrace.profiler.clock import WallClock
from itertrace.profiler.engine import Engine
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.runners.torch.model import ModelConfig
from itertrace.profiler.scheduling.request import PreemptKind
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.runners.torch.torch_runner import TorchRunner
from itertrace.profiler.workloads import RequestSpec, build_requests

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CONFIG = ModelConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256)


class Lockstep:
    """A runner that runs every call on two runners and compares their logits; the first one's go on.

    By default the first runs on the CPU and the second on CUDA, and they agree within 1e-4;
    with `devices=("cuda", "cuda")` they must agree bit for bit (a CUDA run is reproducible).
    """

    name, simulated, reads_tokens = "lockstep", False, True

    def __init__(self, devices=("cpu", "cuda"), **kw) -> None:
        self.cpu = TorchRunner(CONFIG, device=devices[0], **kw)
        self.gpu = TorchRunner(CONFIG, device=devices[1], **kw)
        self.exact = devices[0] == devices[1]
        self.vocab_size = self.cpu.vocab_size
        self.largest_diff = 0.0
        self.kinds: set[str] = set()  # "decodes" (every sequence one token) and "mixed" batches seen
        self.swaps = 0

    def prepare(self, batch: Batch):
        self.kinds.add("decodes" if len(batch.token_ids) == batch.num_seqs else "mixed")
        return self.cpu.prepare(batch), self.gpu.prepare(batch)

    def forward(self, prepared):
        cpu, gpu = self.cpu.forward(prepared[0]), self.gpu.forward(prepared[1])
        assert gpu.device.type == "cuda"
        if self.exact:
            assert torch.equal(gpu, cpu)
        torch.testing.assert_close(gpu.cpu(), cpu.cpu(), rtol=1e-4, atol=1e-4)
        self.largest_diff = max(self.largest_diff, float((gpu.cpu() - cpu.cpu()).abs().max()) if cpu.numel() else 0.0)
        return cpu

    def sample(self, batch: Batch, logits):
        return self.cpu.sample(batch, logits)

    def swap(self, plan: SwapPlan) -> None:
        self.swaps += 1
        self.cpu.swap(plan)
        self.gpu.swap(plan)

    def release(self, request_id: int) -> None:
        self.cpu.release(request_id)
        self.gpu.release(request_id)


def _run(config: SchedulerConfig, *, num_blocks: int, swap_blocks: int = 0, devices=("cpu", "cuda")):
    specs = [RequestSpec(0, 7 + 5 * i, 10 + 4 * i) for i in range(10)]  # each fits 32 blocks of 4 alone
    requests = build_requests(specs, seed=3)
    runner = Lockstep(devices, num_blocks=num_blocks, block_size=4, swap_blocks=swap_blocks, seed=5)
    scheduler = Scheduler(config, BlockManager(num_blocks, 4, swap_blocks))
    Engine(scheduler, runner, WallClock()).run(requests)
    return requests, runner


def test_cuda_logits_equal_cpu_logits_through_chunked_prefill_and_decodes():
    config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24)
    requests, runner = _run(config, num_blocks=256)
    assert runner.kinds == {"decodes", "mixed"}
    assert all(len(r.output_ids) == r.sampling.max_tokens for r in requests)
    print(f"largest |cuda - cpu| logit difference: {runner.largest_diff:.2e}")


def test_two_cuda_runs_give_bit_identical_logits():
    """Decode attention sums each decode's blocks in a fixed order on CUDA (no atomics): a run repeats exactly."""
    _, runner = _run(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24), num_blocks=256,
                     devices=("cuda", "cuda"))
    assert runner.kinds == {"decodes", "mixed"}


@pytest.mark.parametrize("kind", [PreemptKind.SWAP, PreemptKind.RECOMPUTE])
def test_cuda_logits_equal_cpu_logits_under_preemption(kind):
    roomy, _ = _run(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24), num_blocks=256)
    config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, preemption=kind)
    squeezed, runner = _run(config, num_blocks=32, swap_blocks=64)
    assert sum(r.num_preemptions for r in squeezed) > 0
    assert (runner.swaps > 0) == (kind is PreemptKind.SWAP)
    assert [r.output_ids for r in squeezed] == [r.output_ids for r in roomy]


def test_sampled_tokens_on_cuda_equal_those_on_the_cpu():
    """Sampling runs on the CPU from each request's own generator, whatever device ran the model."""
    sampling = SamplingParams(temperature=0.8, top_k=50, top_p=0.9)
    specs = [RequestSpec(0, 6 + 5 * i, 12) for i in range(4)]
    outputs = {}
    for device in ("cpu", "cuda"):
        requests = build_requests(specs, seed=11, sampling=sampling)
        runner = TorchRunner(CONFIG, num_blocks=128, block_size=4, device=device, seed=5)
        Engine(Scheduler(SchedulerConfig(max_num_seqs=4), BlockManager(128, 4)), runner, WallClock()).run(requests)
        outputs[device] = [r.output_ids for r in requests]
    # the logits differ by float rounding only, so a draw could flip at a boundary; over these 48 draws none does
    assert outputs["cuda"] == outputs["cpu"]


def test_cuda_run_writes_logs_that_say_cuda(tmp_path):
    import json

    import pyarrow.parquet as pq

    from itertrace.profiler.session import ModelSpec, RunSpec, run

    spec = RunSpec(scheduler=SchedulerConfig(max_num_seqs=4), runner="torch", num_blocks=128, block_size=4,
                   model=ModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                   intermediate_size=128, device="cuda"))
    requests = build_requests([RequestSpec(0, 8, 6) for _ in range(5)], seed=1)
    run(spec, requests, run_dir=tmp_path)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["device"].startswith("cuda") and meta["device_name"] == torch.cuda.get_device_name()
    its = pq.read_table(tmp_path / "iterations.parquet").to_pydict()
    # forward is read after torch.cuda.synchronize: every iteration with work has a positive forward time
    assert all(f > 0 for f, n in zip(its["forward_ns"], its["num_seqs"]) if n)
    assert sum(its["decode_tokens"]) == 5 * 6 - 5  # the first token of each request comes from its prefill
    assert np.all(np.diff(its["start_ns"]) > 0)


def test_cuda_model_dtype_bfloat16_runs():
    runner = TorchRunner(replace(CONFIG, dtype="bfloat16"), num_blocks=64, block_size=4, device="cuda", seed=5)
    requests = build_requests([RequestSpec(0, 9, 5) for _ in range(3)], seed=2)
    Engine(Scheduler(SchedulerConfig(max_num_seqs=3), BlockManager(64, 4)), runner, WallClock()).run(requests)
    assert [len(r.output_ids) for r in requests] == [5, 5, 5]



@pytest.mark.parametrize("kind", [PreemptKind.RECOMPUTE, PreemptKind.SWAP])
def test_overlap_on_cuda_gives_the_tokens_of_the_engine_without_it(kind):
    """Overlap mode on CUDA (forward passes on the runner's stream, logits copied back into pinned memory behind
    an event, the next batch prepared into the other inputs meanwhile): greedy tokens the same as without it,
    through chunked prefill, decodes and KV pressure (swaps made on the stream), every batch checked."""
    from overlap_checks import CheckedRunner

    specs = [RequestSpec(0, 7 + 5 * i, 10 + 4 * i) for i in range(10)]
    config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, preemption=kind)
    outputs, preempted = {}, 0
    for overlap in (False, True):
        requests = build_requests(specs, seed=3)
        blocks = BlockManager(32, 4, 64)
        runner = TorchRunner(CONFIG, num_blocks=32, block_size=4, swap_blocks=64, device="cuda", seed=5)
        Engine(Scheduler(config, blocks), CheckedRunner(runner, blocks, requests), WallClock(), overlap=overlap).run(requests)
        outputs[overlap] = [r.output_ids for r in requests]
        preempted += sum(r.num_preemptions for r in requests)
    assert preempted > 0
    assert outputs[True] == outputs[False]
