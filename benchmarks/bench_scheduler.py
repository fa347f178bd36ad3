"""Benchmark: the scheduler's host time per iteration (schedule + prepare) at 16-1024 decode sequences.

Steady state: every sequence is decoding, the queue is empty, KV blocks are plentiful. Reports the
median over many iterations of `schedule`, the torch runner's `prepare` (block tables, positions,
slot mapping as tensors, on a tiny model: prepare does not depend on model size), their sum, and
`postprocess`.

The headline ("staggered") gives the sequences contexts of every length modulo the block size, as
real traffic has, so 1/16 of them cross into a new KV block every iteration and the block tables
change every iteration. The second line ("synchronized") starts them all at one length: they all
cross in the same iteration, so the tables change one iteration in 16 and the median hides growth.

Every case runs once per round, --rounds rounds in turn (the machine's quick and slow spells last
seconds; a case's own runs take milliseconds), and the table shows each case's best round with the median
round beside it. Target: schedule + prepare at most 50 us at 256 staggered decodes. On CUDA the runner's
uploads count, and the benchmark synchronizes after prepare, untimed, as the forward pass would.

Usage: python benchmarks/bench_scheduler.py [--sizes 16 64 256 1024] [--rounds 9] [--iterations N]
The latest figures are in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.runners.torch.model import ModelConfig
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.runners.torch.torch_runner import TorchRunner
from itertrace.profiler.workloads import RequestSpec, build_requests

BLOCK = 16
PROMPT = 64
ROUNDS = 9  # rounds of every case, in turn (see main)


def bench(n: int, iters: int, staggered: bool) -> dict[str, float]:
    """Medians (us) of schedule, prepare and postprocess over `iters` steady decode iterations of n sequences."""
    blocks_per_seq = (PROMPT + BLOCK + iters + 64) // BLOCK + 2
    blocks = BlockManager(n * blocks_per_seq, BLOCK)
    sched = Scheduler(SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=max(2048, n * (PROMPT + BLOCK))),
                      blocks)
    runner = TorchRunner(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                     intermediate_size=64), num_blocks=n * blocks_per_seq, block_size=BLOCK)
    prompts = [PROMPT + (i % BLOCK if staggered else 0) for i in range(n)]
    for req in build_requests([RequestSpec(0, p, iters + 8) for p in prompts]):
        sched.add(req, 0)
    timings: dict[str, list[float]] = {"schedule": [], "prepare": [], "postprocess": []}
    for it in range(iters + 3):
        t0 = time.perf_counter_ns()
        d = sched.schedule(it)
        t1 = time.perf_counter_ns()
        runner.prepare(d.batch)
        t2 = time.perf_counter_ns()
        if runner.device.type == "cuda":  # as the forward pass would, untimed: the uploads are done
            torch.cuda.synchronize(runner.device)
        tokens = np.full(len(d.batch.sampled_ids), 65)
        t3 = time.perf_counter_ns()
        sched.postprocess(d, tokens, it)
        t4 = time.perf_counter_ns()
        if it >= 3:  # the first iterations prefill; measure steady decode only
            assert d.decode_tokens == n and not d.admitted and blocks.device.num_free, it
            timings["schedule"].append((t1 - t0) / 1e3)
            timings["prepare"].append((t2 - t1) / 1e3)
            timings["postprocess"].append((t4 - t3) / 1e3)
    return {k: statistics.median(v) for k, v in timings.items()}


def main(argv: list[str] | None = None) -> None:
    """Every case once per round, --rounds rounds in turn: the rounds spread over the machine's quick and slow
    spells, which last seconds (a case's own runs take milliseconds, so repeating a case at once only
    ever meets the spell it started in). For each case the best round is shown, and the median round's
    schedule + prepare beside it, so the spread stays in sight."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024],
                        help="decode sequences of each case (default 16 64 256 1024)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of every case, in turn (default {ROUNDS})")
    parser.add_argument("--iterations", type=int, default=None,
                        help="measured iterations per case and round (default 200, 60 above 256 sequences)")
    args = parser.parse_args(argv)
    cases = [(n, staggered) for n in args.sizes for staggered in (True, False)]
    runs: dict[tuple[int, bool], list[dict[str, float]]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for n, staggered in cases:
            runs[n, staggered].append(bench(n, args.iterations or (200 if n <= 256 else 60), staggered))
    print(f"{'case':>12}  {'decode seqs':>11}  {'schedule us':>11}  {'prepare us':>10}  {'sched+prep us':>13}"
          f"  {'postprocess us':>14}  {'median round':>12}")
    for n, staggered in cases:
        totals = sorted(run["schedule"] + run["prepare"] for run in runs[n, staggered])
        r = min(runs[n, staggered], key=lambda run: run["schedule"] + run["prepare"])
        print(f"{'staggered' if staggered else 'synchronized':>12}  {n:>11}  {r['schedule']:>11.1f}"
              f"  {r['prepare']:>10.1f}  {r['schedule'] + r['prepare']:>13.1f}  {r['postprocess']:>14.1f}"
              f"  {statistics.median(totals):>12.1f}")


if __name__ == "__main__":
    main()
