"""Captures of several ranks for the fleet tests, each rank's iteration times chosen by the test.

`kineto_rank` writes a PyTorch profiler trace as `itertrace run --torch-profile` names things (a `step`
range per iteration carrying its number, domain itertrace) with distributedInfo's rank and world size,
and one kernel per step; each file gets a clock of its own (baseTimeNanoseconds hours apart, its first
step at an offset of its own), so that only iteration numbers can line the ranks up. `nsys_node` writes
one node's nsys export of several processes, a GPU each, with TensorRT-LLM's step ranges (numbered in
their text); with `nccl=True` each process also opens an NCCL communicator whose payload names its rank.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from nsys_shaped import Capture

HOUR_NS = 3_600_000_000_000
BASE_NS = 1_780_000_000_000_000_000
GAP_US = 200  # host time between one step's end and the next one's start


def kineto_rank(path: Path, rank: int, world_size: int | None, step_us: dict[int, int]) -> Path:
    """A trace of one rank: a step per iteration number in `step_us`, lasting the µs given."""
    pid = 4000 + 7 * rank
    t = 1_000 + 37 * rank  # µs from the file's own base time
    events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "python"}},
              {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": "engine"}}]
    for k, (iteration, dur) in enumerate(sorted(step_us.items())):
        correlation = 100 + k
        events += [
            {"ph": "X", "cat": "user_annotation", "name": "step", "pid": pid, "tid": pid, "ts": t, "dur": dur,
             "args": {"Concrete Inputs": [str(iteration)]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid, "ts": t + 10,
             "dur": 5, "args": {"correlation": correlation}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": rank, "tid": 7, "ts": t + 20, "dur": dur - 40,
             "args": {"correlation": correlation, "device": rank, "stream": 7}},
        ]
        t += dur + GAP_US
    document = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS + rank * HOUR_NS,
                "deviceProperties": [{"id": rank, "name": "NVIDIA H100 80GB HBM3"}],
                "itertrace": {"domain": "itertrace", "marks": []}, "traceEvents": events}
    if world_size is not None:
        document["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def nsys_node(folder: Path, step_ns: dict[int, dict[int, int]], *, nccl: bool = False) -> Path:
    """One node's export: per process p (on device p, or 3 - p with NCCL ranks), a step per iteration number in
    `step_ns[p]`, lasting the ns given; with `nccl`, process p is NCCL rank p of len(step_ns)."""
    c = Capture()
    ranks = len(step_ns)
    payloads = {}
    for p, steps in sorted(step_ns.items()):
        tid = c.thread(600 + 10 * p, 600 + 10 * p, "python")
        device = (ranks - 1 - p) if nccl else p
        t = 5_000 + 1_000 * p
        if nccl:
            c.range(tid, "ncclCommInitRank", t - 3_000, t - 2_000, domain="NCCL")
            payloads[tid] = {"NCCL communicator ID": 77, "No. of ranks": ranks, "Rank": p, "CUDA device": device}
        correlation_base = len(c.calls)
        for iteration, dur in sorted(steps.items()):
            c.range(tid, f"[Executor] _forward_step {iteration}: 0 ctx reqs, 8 gen reqs", t, t + dur,
                    domain="TensorRT-LLM")
            c.launch(tid, t + 100, t + 200, t + 400, t + dur - 100, device=device)
            t += dur + 500
        assert len(c.calls) > correlation_base
    c.write(folder)
    if payloads:
        _add_payloads(folder / "NVTX_EVENTS.parquet", payloads)
    return folder


def _add_payloads(file: Path, payloads: dict[int, dict]) -> None:
    """NVTX_EVENTS with a jsonText column: each ncclCommInitRank range's payload, as the export holds it."""
    events = pq.read_table(file)
    texts = [json.dumps(payloads[tid]) if text == "ncclCommInitRank" else None
             for text, tid in zip(events.column("text").to_pylist(), events.column("globalTid").to_pylist())]
    pq.write_table(events.append_column("jsonText", pa.array(texts, pa.string())), file)
