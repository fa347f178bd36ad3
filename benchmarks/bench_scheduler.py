"""Benchmark: the scheduler's host time per iteration (schedule + prepare) at 16-1024 decode sequences.

Steady state: every sequence is decoding, the queue is empty, KV blocks are plentiful. Reports the
median over many iterations of `schedule`, the torch runner's `prepare` (block tables, positions,
slot mapping as tensors, on a tiny model: prepare does not depend on model size), and `postprocess`;
each size runs three times and the run with the lowest schedule + prepare is shown, since a shared
machine only ever adds time.
Run: .venv/bin/python benchmarks/bench_scheduler.py

Measured (2-core shared machine, 2026-11-29). The machine has quick spells and slow ones, in which
every call takes about 1.6 times as long, with or without other load. In a quick spell schedule +
prepare is 29 us at 16 decodes, 29 at 64, 33 at 256 (prepare 12-15 of it, 49-58 before prepare's
decode path came down to about ten numpy calls, none per sequence); in a slow spell 50-61 at 16 and
64, 55-69 at 256, 78-81 at 1024 (medians of eight runs alternating with the previous runner in one
process, by helper-14). Three plain runs at load 0.7 gave 56, 64 and 33 us at 256 (schedule 31, 34,
19). So the issue-2 target (at most 50 us at 256) is met in quick spells and missed in slow ones.
Every sequence here crosses into a new KV block in the same iteration, so the block tables change one
iteration in 16; with staggered lengths some row does every iteration, and prepare copies and checks
the tables each time: about 10 us more at 256 in a slow spell.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from itertrace.profiler.kv import BlockManager
from itertrace.profiler.model import ModelConfig
from itertrace.profiler.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.torch_runner import TorchRunner
from itertrace.profiler.workloads import RequestSpec, build_requests

BLOCK = 16
PROMPT = 64


def bench(n: int, iters: int) -> dict[str, float]:
    blocks_per_seq = (PROMPT + iters + 64) // BLOCK + 2
    blocks = BlockManager(n * blocks_per_seq, BLOCK)
    sched = Scheduler(SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=max(2048, n * PROMPT)), blocks)
    runner = TorchRunner(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                     intermediate_size=64), num_blocks=n * blocks_per_seq, block_size=BLOCK)
    for req in build_requests([RequestSpec(0, PROMPT, iters + 8) for _ in range(n)]):
        sched.add(req, 0)
    tokens = {}
    it = 0
    timings: dict[str, list[float]] = {"schedule": [], "prepare": [], "postprocess": []}
    for it in range(iters + 3):
        t0 = time.perf_counter_ns()
        d = sched.schedule(it)
        t1 = time.perf_counter_ns()
        runner.prepare(d.batch)
        t2 = time.perf_counter_ns()
        tokens = np.full(len(d.batch.sampled_ids), 65)
        t3 = time.perf_counter_ns()
        sched.postprocess(d, tokens, it)
        t4 = time.perf_counter_ns()
        if it >= 3:  # the first iterations prefill; measure steady decode only
            assert d.decode_tokens == n, (it, d.decode_tokens)
            timings["schedule"].append((t1 - t0) / 1e3)
            timings["prepare"].append((t2 - t1) / 1e3)
            timings["postprocess"].append((t4 - t3) / 1e3)
    return {k: statistics.median(v) for k, v in timings.items()}


def main() -> None:
    print(f"{'decode seqs':>11}  {'schedule us':>11}  {'prepare us':>10}  {'sched+prep us':>13}  {'postprocess us':>14}")
    for n in (16, 64, 256, 1024):
        runs = [bench(n, iters=200 if n <= 256 else 60) for _ in range(3)]
        r = min(runs, key=lambda run: run["schedule"] + run["prepare"])
        print(f"{n:>11}  {r['schedule']:>11.1f}  {r['prepare']:>10.1f}  {r['schedule'] + r['prepare']:>13.1f}"
              f"  {r['postprocess']:>14.1f}")


if __name__ == "__main__":
    main()
