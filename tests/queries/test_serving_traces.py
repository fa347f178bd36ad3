"""Real vLLM and SGLang server traces (../shared/serving_traces/): what a user of those engines gets with no parameters."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from gpu_time_reference import api_class

from itertrace.ingest import ingest
from itertrace.queries import QueryDB

SERVING = Path(__file__).resolve().parents[2].parent / "shared" / "serving_traces"
TRACES = ("vllm_decode_full_graph_step", "sglang_qwen3_8b_decode_step", "sglang_qwen3_8b_prefill_decode_step")

needs_traces = pytest.mark.skipif(not SERVING.is_dir(), reason=f"the real serving traces are not at {SERVING}")


@pytest.fixture(scope="module")
def serving_dbs(tmp_path_factory) -> dict[str, Path]:
    if not SERVING.is_dir():
        pytest.skip(f"the real serving traces are not at {SERVING}")
    folder = tmp_path_factory.mktemp("serving")
    dbs = {}
    for name in TRACES:
        dbs[name] = folder / f"{name}.duckdb"
        ingest([SERVING / f"{name}.json.gz"], dbs[name])
    return dbs


API_CLASSES = {
    "cuda_sync": ["cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                  "cudaMemcpy2D", "cuCtxSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize",
                  "hipEventSynchronize", "hipMemcpy", "hipMemcpyWithStream", "hipMemcpyDtoH", "hipMemcpyHtoD"],
    "cuda_launch": ["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                    "cudaLaunchCooperativeKernel", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel",
                    "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", "hipLaunchCooperativeKernel"],
    "cuda_graph_launch": ["cudaGraphLaunch", "hipGraphLaunch"],
    "cuda_memcpy": ["cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpyPeerAsync", "hipMemcpyAsync",
                    "hipMemcpyHtoDAsync", "hipMemcpyDtoHAsync", "hipMemcpy2DAsync"],
    "cuda_memset": ["cudaMemsetAsync", "cudaMemset", "cuMemsetD32Async", "hipMemsetAsync", "hipMemsetD32Async",
                    "hipMemset"],
    "cuda_other": ["cudaEventQuery", "cudaEventRecord", "cudaStreamWaitEvent", "cudaMalloc", "cudaFree",
                   "hipEventQuery", "hipStreamWaitEvent", "hipPointerGetAttribute", "hipMalloc",
                   "hipGetDevicePropertiesR0600", "INVALID"],
}


def test_hip_calls_are_classed_as_their_cuda_counterparts():
    """Each class holds its CUDA and HIP names alike (the runtime's, the driver's, Kineto's, rocprof's); the
    SQL macro and the Python reference the accounting tests use agree on every one."""
    from itertrace.queries.catalog import definitions

    con = duckdb.connect()
    con.execute(definitions()["host_activity_api_class"].statement)
    names = [name for group in API_CLASSES.values() for name in group]
    got = dict(con.execute("SELECT name, host_activity_api_class(name) FROM unnest(?::VARCHAR[]) t(name)",
                           [names]).fetchall())
    assert {kind: [n for n in names if got[n] == kind] for kind in API_CLASSES} == API_CLASSES
    assert all(api_class(name) == kind for kind, group in API_CLASSES.items() for name in group)


@needs_traces
def test_the_rocm_traces_calls_fall_in_their_classes(serving_dbs):
    """The HIP runtime calls of the real ROCm traces, as the idle accounting classes them."""
    seen: dict[str, set[str]] = {}
    for db in serving_dbs.values():
        with QueryDB(db) as q:
            for kind, cause in q.con.execute("SELECT cause_kind, cause FROM host_activity_causes "
                                             "WHERE cause_kind <> 'nvtx'").fetchall():
                seen.setdefault(kind, set()).add(cause)
    assert {"hipMemcpyWithStream", "hipEventSynchronize"} <= seen["cuda_sync"]
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel"} <= seen["cuda_launch"]
    assert seen["cuda_graph_launch"] == {"hipGraphLaunch"}
    assert seen["cuda_memcpy"] == {"hipMemcpyAsync"}
    assert "hipMemcpyWithStream" not in seen["cuda_other"] and "hipGraphLaunch" not in seen["cuda_other"]


# The union of each trace's GPU work (kernels, copies, sets) over its first start to last end, per device,
# computed from the JSON alone with exact decimal times, outside itertrace; and Holistic Trace Analysis
# 0.5.0's temporal breakdown of the same file with HTA_DISABLE_NS_ROUNDING=1 (its default rounds each
# kernel inward to whole microseconds, which on the vLLM step's 434 short kernels reads 4.26% idle for
# 0.24%). Run by hand, in a virtual environment of its own: TraceAnalysis(trace_dir=...).get_temporal_breakdown().
# (file: (GPU ops, window start ns, window end ns, busy ns, HTA idle us, HTA kernel_time us))
UNION_AND_HTA = {
    "vllm_decode_full_graph_step": (434, 6520618861858561, 6520618872601742, 10_717_708, 25.474, 10_743.182),
    "sglang_qwen3_8b_decode_step": (558, 4909914216285224, 4909914690035167, 9_772_926, 463_977.018, 473_749.944),
    "sglang_qwen3_8b_prefill_decode_step": (534, 4909913692278281, 4909914679567168, 492_806_877, 494_482.010,
                                            987_288.887),
}


@needs_traces
@pytest.mark.parametrize("name", TRACES)
def test_busy_share_is_the_union_and_agrees_with_hta(serving_dbs, name):
    """The traces carry no profiler span (they were cut to one step): each GPU's window is its work's first
    start to last end, as HTA takes it, and its idle time is HTA's to the rounding of its float microseconds."""
    ops, start, end, busy, hta_idle_us, hta_window_us = UNION_AND_HTA[name]
    with QueryDB(serving_dbs[name]) as db:
        (row,) = db.query("gpu_time").to_pylist()
        (summary,) = db.query("gpu_time_summary").to_pylist()
    assert (row["gpu_ops"], row["window_start_ns"], row["window_end_ns"], row["busy_ns"]) == (ops, start, end, busy)
    assert row["window_source"] == summary["window_source"] == "GPU work"
    assert row["idle_ns"] == row["idle_within_ns"] + row["idle_between_ns"] + row["idle_outside_ns"]
    assert summary["busy_share"] == busy / (end - start)
    assert abs(row["window_ns"] / 1000 - hta_window_us) < 0.01 and abs(row["idle_ns"] / 1000 - hta_idle_us) < 0.01


# Per trace, what a user of that engine gets with no parameter: the preset auto chooses, the iteration range's
# name, and the counts its text carries.
FOUND = {
    "vllm_decode_full_graph_step": (
        "vllm", "execute_#_context_#(sq#sk#sqsq#sqsk#)_generation_#(sq#sk#sqsq#sqsk#)",
        {"batch_size": 32, "tokens": 32, "prefill_requests": 0, "prefill_tokens": 0, "decode_requests": 32, "decode_tokens": 32,
         "context_tokens": 55086}),
    "sglang_qwen3_8b_decode_step": ("sglang", "step[DECODE bs=#]", {"mode": "DECODE", "batch_size": 32}),
    "sglang_qwen3_8b_prefill_decode_step": ("sglang", "step[EXTEND bs=# toks=#]",
                                            {"mode": "EXTEND", "batch_size": 15, "tokens": 15360}),
}


def _counts(row: dict) -> dict:
    return {k: v for k, v in row.items() if v is not None and k not in ("iteration", "global_tid", "step_range_id")}


@needs_traces
@pytest.mark.parametrize("steps", [1, 50])
@pytest.mark.parametrize("name", TRACES)
def test_auto_finds_the_engines_steps(serving_dbs, tmp_path, name, steps):
    """With no parameter, the iterations are the engine's steps, exactly as many as the capture holds (one
    trace, or 50 copies of it one after another), each with the batch its text carries; the idle splits add
    up, to each GPU's window and to each idle span."""
    from serving_captures import build

    db = serving_dbs[name] if steps == 1 else tmp_path / "steps.duckdb"
    if steps > 1:
        ingest([build(name, steps=steps, out_path=tmp_path / f"{name}.json.gz")], db)
    preset, step_name, counts = FOUND[name]
    with QueryDB(db) as q:
        assert (q.mapping_choice.preset, q.mapping_choice.ranges, q.mapping_choice.name) == (preset, steps, step_name)
        iterations = q.query("iterations").to_pylist()
        assert [r["iteration"] for r in iterations] == list(range(steps))
        assert all(r["gpu_op_count"] > 0 for r in iterations)
        assert [_counts(r) for r in q.query("step_counts").to_pylist()] == [counts] * steps
        (gpu,) = q.query("gpu_time").to_pylist()
        assert gpu["iterations"] == steps
        assert gpu["window_ns"] == gpu["busy_ns"] + gpu["idle_within_ns"] + gpu["idle_between_ns"] + gpu["idle_outside_ns"]
        spans = {r["start_ns"]: r["dur_ns"] for r in q.query("gpu_time_idle").to_pylist()}
        parts: dict[int, int] = {}
        for r in q.query("gpu_idle_parts").to_pylist():
            parts[r["idle_start_ns"]] = parts.get(r["idle_start_ns"], 0) + r["dur_ns"]
        assert parts == spans
        gaps = sum(r["gap_ns"] for r in q.query("host_gaps").to_pylist())
        assert gaps == gpu["idle_between_ns"]  # one track: the host gaps are the idle time between steps
        first = q.sql("SELECT name, preset FROM mapping_suggest WHERE rank = 1").to_pylist()
    assert first == [{"name": step_name, "preset": preset}]


@needs_traces
@pytest.mark.parametrize("name, frame", [("sglang_qwen3_8b_decode_step", "cuda_graph_runner.py(1251): replay_prepare"),
                                         ("sglang_qwen3_8b_prefill_decode_step", "tp_worker.py(445): forward_batch_generation")])
def test_idle_time_names_the_servers_code(serving_dbs, name, frame):
    """The blocking hipMemcpyWithStream that held the GPU idle for most of each SGLang step is named, with the
    line of SGLang's code it ran in; idle time no call covers names the Python function the thread was in.
    (The vLLM step's host events end 6 ms before its GPU work starts, so no host activity covers its 25 us of
    idle time: it stays unattributed there.)"""
    with QueryDB(serving_dbs[name]) as q:
        (summary,) = q.query("gpu_time_summary").to_pylist()
        parts = q.sql("SELECT cause_kind, cause, engine_frame, sum(dur_ns) AS ns FROM gpu_idle_parts "
                      "GROUP BY ALL ORDER BY ns DESC").to_pylist()
    assert (summary["top_cause_kind"], summary["top_cause"]) == ("cuda_sync", "hipMemcpyWithStream")
    assert summary["top_cause_share"] > 0.99
    assert parts[0]["cause"] == "hipMemcpyWithStream" and parts[0]["engine_frame"].endswith(frame)
    python = [p for p in parts if p["cause_kind"] == "python"]
    assert python and ".py(" in python[0]["engine_frame"]  # the largest: inside an engine-level frame
    unattributed = sum(p["ns"] for p in parts if p["cause_kind"] == "unattributed")
    assert sum(p["ns"] for p in python) > unattributed
