"""Captures shaped like vLLM's, SGLang's and TensorRT-LLM's, with the NVTX names each engine emits.

Each builder lays out a few dozen iterations the way the engine's loop runs them (see the comments
of queries/mapping.sql for where each name comes from) and simulates the GPU: an operation starts
300 ns after its launching call ends, or when its stream is free. Several steps are slower on the
host (a prefill), so the GPU idles between iterations; vLLM's and SGLang's loops launch iteration
N+1 while the GPU still runs N, and a copy on a second stream makes consecutive device intervals
overlap. Each returns the Capture and what the test needs to know about it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from nsys_shaped import Capture, GpuKind

LAUNCH_LATENCY_NS = 300


@dataclass
class Gpu:
    """When each stream of each device is free: operations on one stream run one after another."""

    free: dict[tuple[int, int], int] = field(default_factory=dict)

    def run(self, capture: Capture, tid: int, call_ns: int, dur_ns: int, *, device: int = 0, stream: int = 7,
            kind: GpuKind = GpuKind.KERNEL, name: str = "kernel", api: str | None = None) -> tuple[int, int]:
        """Launch one operation from a 100 ns call at call_ns; returns its [start, end) on the GPU."""
        start = max(call_ns + 100 + LAUNCH_LATENCY_NS, self.free.get((device, stream), 0))
        self.free[device, stream] = start + dur_ns
        capture.launch(tid, call_ns, call_ns + 100, start, start + dur_ns, device=device, stream=stream,
                       kind=kind, name=name, api=api)
        return start, start + dur_ns


@dataclass(frozen=True)
class Built:
    """A capture and the facts a test checks against."""

    capture: Capture
    step_name: str  # the iteration range's name with digits as #
    steps: int  # iterations per rank
    counts: list[tuple[int, int, int, int]]  # per iteration: prefill requests, tokens, decode requests, tokens


def vllm(steps: int = 24) -> Built:
    """vLLM V1 with async scheduling: Worker.execute_model's range per step, the model runner's scopes."""
    c, gpu = Capture(), Gpu()
    tid = c.thread(300, 300, "EngineCore_0")
    t, counts = 1_000, []
    for i in range(steps):
        prefill = i % 6 == 0
        n = (2, 180, 0, 0) if i == 0 else (1, 96, 3, 3) if prefill else (0, 0, 4, 4)
        counts.append(n)
        host = 9_000 if prefill else 3_000
        c.range(tid, f"execute_context_{n[0]}({n[1]})_generation_{n[2]}({n[3]})", t, t + host)
        c.range(tid, "gpu_model_runner: preprocess", t + 50, t + host - 2_500)
        # the inputs' copy, on a stream of its own, overlaps the end of the step before (a prefill's comes later)
        gpu.run(c, tid, t + (2_000 if prefill else 60), 100, stream=8, kind=GpuKind.MEMCPY,
                name="[CUDA memcpy Host-to-Device]")
        c.range(tid, "gpu_model_runner: forward", t + host - 2_400, t + host - 400)
        for k in range(3):
            gpu.run(c, tid, t + host - 2_300 + 600 * k, 1_150, name=("gemm", "attention", "gemm")[k])
        c.range(tid, "gpu_model_runner: postprocess", t + host - 400, t + host - 50)
        # sample_tokens runs after execute_model returns: outside the step's range
        c.range(tid, "gpu_model_runner: sample", t + host, t + host + 600)
        gpu.run(c, tid, t + host + 100, 400, name="sampler")
        c.range(tid, "gpu_model_runner: bookkeep", t + host + 600, t + host + 900)
        t += host + 1_000
    c.call(tid, "cudaDeviceSynchronize_v3020", t, t + 4_000)
    return Built(c, "execute_context_#(#)_generation_#(#)", steps, counts)


def sglang(steps: int = 24) -> Built:
    """SGLang's overlap event loop under SGLANG_ENABLE_NVTX_SCHEDULER: run_batch launches batch N+1 before
    process_batch_result handles batch N, whose copy to the host runs on a stream of its own."""
    c, gpu = Capture(), Gpu()
    tid = c.thread(400, 400, "sglang::scheduler")
    t = 2_000
    for i in range(steps):
        prefill = i % 5 == 0
        c.range(tid, "scheduler.recv_requests", t, t + 200)
        c.range(tid, "scheduler.process_input_requests", t + 200, t + 400)
        pick = 6_000 if prefill else 500
        c.range(tid, "scheduler.get_next_batch_to_run", t + 400, t + 400 + pick)
        start = t + 400 + pick
        c.range(tid, "scheduler.run_batch", start, start + 900)
        for k in range(3):
            gpu.run(c, tid, start + 100 + 250 * k, 900, name=("resolve_future", "forward", "sample")[k])
        gpu.run(c, tid, start + 800, 200, stream=9, kind=GpuKind.MEMCPY, name="[CUDA memcpy Device-to-Host]")
        c.range(tid, "scheduler.process_batch_result", start + 900, start + 1_600)
        if i:
            c.call(tid, "cudaEventSynchronize_v3020", start + 1_000, start + 1_300)
        t = start + 1_700
    c.range(tid, "scheduler.event_loop_overlap", 1_000, t + 500)  # a fork's range around the whole loop
    return Built(c, "scheduler.run_batch", steps, [])


TRTLLM = "TensorRT-LLM"


def trtllm(steps: int = 20, ranks: int = 2) -> Built:
    """TensorRT-LLM's PyTorch executor on `ranks` tensor-parallel ranks, each a process on its own GPU that emits
    its own copy of every range (domain TensorRT-LLM) and joins an all-reduce each step."""
    c, gpu = Capture(), Gpu()
    counts = []
    tids = [c.thread(500 + 100 * r, 500 + 100 * r, "python") for r in range(ranks)]
    t = 3_000
    for i in range(steps):
        n = (1, None, 0, None) if i % 7 == 0 else (0, None, 8, None)
        counts.append(n)
        host = 7_000 if n[0] else 2_000
        for r, tid in enumerate(tids):
            skew = 150 * r  # ranks run the same loop, a little apart
            s = t + skew
            c.range(tid, "_fetch_new_requests", s, s + 300, domain=TRTLLM)
            c.range(tid, "_schedule", s + 300, s + 600, domain=TRTLLM)
            c.range(tid, "prepare_resources", s + 600, s + 900, domain=TRTLLM)
            c.range(tid, f"[Executor] _forward_step {i + 1}: {n[0]} ctx reqs, {n[2]} gen reqs", s + 900,
                    s + 900 + host, domain=TRTLLM)
            c.range(tid, "_prepare_inputs", s + 1_000, s + host - 300, domain=TRTLLM)
            for k in range(2):
                gpu.run(c, tid, s + host - 200 + 300 * k, 1_200, device=r, name=("gemm", "allreduce")[k])
            c.range(tid, "_sample_async", s + 900 + host, s + 1_300 + host, domain=TRTLLM)
            gpu.run(c, tid, s + 1_000 + host, 300, device=r, name="sampler")
            c.range(tid, "_update_requests", s + 1_300 + host, s + 2_100 + host, domain=TRTLLM)
            c.call(tid, "cudaEventSynchronize_v3020", s + 1_400 + host, s + 2_000 + host)
            c.range(tid, "_handle_responses", s + 2_100 + host, s + 2_400 + host, domain=TRTLLM)
        t += host + 2_600
    return Built(c, "[Executor] _forward_step #: # ctx reqs, # gen reqs", steps, counts)


def overlapping_steps(steps: int = 12) -> Built:
    """A loop whose iteration ranges are start/end ranges, each opened before the one before it closes: the
    host intervals of consecutive iterations overlap."""
    c, gpu = Capture(), Gpu()
    tid = c.thread(700, 700, "main")
    t = 1_000
    for i in range(steps):
        c.range(tid, f"decode_step_{i}", t, t + 5_000, push_pop=False)
        c.range(tid, "prepare", t + 200, t + 1_200)
        gpu.run(c, tid, t + 1_200, 800 if i % 3 else 2_500)
        gpu.run(c, tid, t + 1_400, 700, stream=8)
        c.range(tid, "detokenize", t + 1_600, t + 2_400)
        t += 3_000  # the next step opens while this one is still open
    return Built(c, "decode_step_#", steps, [])
