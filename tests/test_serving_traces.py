"""Real vLLM and SGLang server traces (../shared/serving_traces/): what a user of those engines gets with no parameters."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from gpu_time_reference import api_class

from itertrace.ingest import ingest
from itertrace.queries import QueryDB

SERVING = Path(__file__).resolve().parents[1].parent / "shared" / "serving_traces"
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
            for kind, cause in q.con.execute("SELECT cause_kind, cause FROM _host_activity_causes "
                                             "WHERE cause_kind <> 'nvtx'").fetchall():
                seen.setdefault(kind, set()).add(cause)
    assert {"hipMemcpyWithStream", "hipEventSynchronize"} <= seen["cuda_sync"]
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel"} <= seen["cuda_launch"]
    assert seen["cuda_graph_launch"] == {"hipGraphLaunch"}
    assert seen["cuda_memcpy"] == {"hipMemcpyAsync"}
    assert "hipMemcpyWithStream" not in seen["cuda_other"] and "hipGraphLaunch" not in seen["cuda_other"]
