"""GPU time chart functions: their specs on small tables, and how they bin a large one."""
from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
import pytest

from itertrace.dashboards import gpu_time_chart, idle_causes_chart, kernels_chart

MS = 1_000_000


def dataset(chart) -> list[dict]:
    spec = chart.to_dict()
    return next(iter(spec["datasets"].values()))


def idle(rows: list[tuple[int, int, int, str]], device: int = 0) -> pa.Table:
    return pa.table({"device_id": [device] * len(rows), "global_pid": [7 << 24] * len(rows),
                     "start_ns": [r[0] for r in rows], "end_ns": [r[1] for r in rows],
                     "dur_ns": [r[1] - r[0] for r in rows], "kind": [r[3] for r in rows],
                     "iteration": [r[2] for r in rows]})


def window(lo: int, hi: int, devices: int = 1) -> pa.Table:
    return pa.table({"device_id": list(range(devices)), "global_pid": [7 << 24] * devices,
                     "window_start_ns": [lo] * devices, "window_end_ns": [hi] * devices})


def test_gpu_time_chart_shares_per_bin_are_exact_and_add_up_to_one():
    spans = idle([(0, 25 * MS, None, "outside"), (40 * MS, 60 * MS, 0, "between"), (70 * MS, 75 * MS, 1, "within")])
    chart = gpu_time_chart(spans, window(0, 100 * MS), max_points=40)  # 10 bins of 10 ms
    spec = chart.to_dict()
    assert spec["mark"]["type"] == "area" and spec["encoding"]["y"]["stack"] == "zero"
    rows = dataset(chart)
    assert len(rows) == 10 * 4
    share = {(r["start_ms"], r["kind"]): r["share"] for r in rows}
    assert share[0.0, "idle outside iterations"] == 1.0 and share[20.0, "idle outside iterations"] == 0.5
    assert share[20.0, "busy"] == 0.5 and share[40.0, "idle between iterations"] == 1.0
    assert share[70.0, "idle within an iteration"] == 0.5 and share[90.0, "busy"] == 1.0
    sums = defaultdict(float)
    for r in rows:
        sums[r["start_ms"]] += r["share"]
    assert all(v == pytest.approx(1.0) for v in sums.values())


def test_gpu_time_chart_of_many_spans_embeds_at_most_max_points_rows_one_row_per_gpu():
    n = 200_000
    spans = pa.concat_tables([idle([(i * 1000, i * 1000 + 400, i, "within") for i in range(n)], device=d)
                              for d in (0, 1)])
    chart = gpu_time_chart(spans, window(0, n * 1000, devices=2), max_points=4000)
    rows = dataset(chart)
    assert len(rows) <= 4000 and {r["gpu"] for r in rows} == {"GPU 0, pid 7", "GPU 1, pid 7"}
    assert chart.to_dict()["encoding"]["row"]["field"] == "gpu"
    idle_share = [r["share"] for r in rows if r["kind"] == "idle within an iteration"]
    assert idle_share and all(s == pytest.approx(0.4) for s in idle_share)


def test_idle_causes_chart_keeps_the_largest_causes_split_by_kind():
    causes = pa.table({"cause_kind": ["nvtx", "cuda_sync", "unattributed", "nvtx"],
                       "cause": ["sample", "cudaStreamSynchronize", "unattributed", "schedule"],
                       "within_ns": [0, 5 * MS, 1 * MS, 0], "between_ns": [8 * MS, 0, 2 * MS, 1 * MS],
                       "outside_ns": [0, 0, 3 * MS, 0]})
    chart = idle_causes_chart(causes, max_causes=3)
    rows = dataset(chart)
    assert {r["cause"] for r in rows} == {"sample (nvtx)", "unattributed (unattributed)",
                                          "cudaStreamSynchronize (cuda_sync)"}
    assert chart.to_dict()["encoding"]["y"]["sort"] == ["sample (nvtx)", "unattributed (unattributed)",
                                                        "cudaStreamSynchronize (cuda_sync)"]
    assert sum(r["ms"] for r in rows if r["cause"] == "unattributed (unattributed)") == 6.0


FLASH = ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::half_t, "
         "Flash_kernel_traits<128, 64, 64, 4, cutlass::half_t> >, false, true, false, false, true, true, false, "
         "false>(Flash_fwd_params)")


def test_kernels_chart_shows_short_names_and_keeps_the_full_one_for_the_tooltip():
    reduce = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, " \
             "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, " \
             "float, 4>)"
    kernels = pa.table({"kind": ["kernel", "memcpy", "kernel", "kernel"],
                        "name": [FLASH, "[CUDA memcpy Host-to-Device]", reduce, reduce.replace("512", "128")],
                        "ops": [3, 1, 2, 2], "total_ns": [9 * MS, 4 * MS, 3 * MS, 2 * MS],
                        "share": [0.5, 0.2, 0.2, 0.1], "mean_ns": [3 * MS, 4 * MS, MS, MS]})
    chart = kernels_chart(kernels)
    rows = dataset(chart)
    assert [r["label"] for r in rows] == ["flash_fwd_kernel", "[CUDA memcpy Host-to-Device]", "reduce_kernel",
                                          "reduce_kernel (variant 2)"]  # two bars, not one
    assert rows[0]["name"] == FLASH and rows[0]["total_ms"] == 9.0
    spec = chart.to_dict()
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["y"]["field"] == "label"
    assert {"label", "name"} <= {t["field"] for t in spec["encoding"]["tooltip"]}


def iterations(n: int, period: int = 10 * MS) -> pa.Table:
    start = [i * period for i in range(n)]
    return pa.table({"iteration": list(range(n)), "host_start_ns": start, "host_end_ns": [s + 2 * MS for s in start],
                     "device_start_ns": [s + 3 * MS for s in start], "device_end_ns": [s + 8 * MS for s in start]})


def test_gpu_time_chart_of_many_steps_bins_them_into_numbered_bands():
    n = 10_000
    chart = gpu_time_chart(idle([(0, MS, None, "outside")]), window(0, n * 10 * MS), iterations=iterations(n),
                           origin_ns=0, max_steps=500).to_dict()
    strip, area = chart["vconcat"]
    assert area["encoding"]["x"]["title"] == "time since the capture started (s)"  # 100 s
    (bands,) = [u for u in strip["layer"] if u["mark"]["type"] == "rect"]
    assert len(strip["layer"]) == 1  # 500 bands: too many to number
    rows = next(r for r in chart["datasets"].values() if "shade" in r[0])
    host = sorted((r["start_s"], r["end_s"], r["step"]) for r in rows if r["lane"] == "host step")
    assert len(host) == 500 and len(rows) == 1000
    assert host[0] == (0.0, 0.192, "0–19") and host[-1] == (99.8, 99.992, "9980–9999")  # 20 steps a band
    assert {t.get("title") for t in bands["encoding"]["tooltip"]} >= {"steps", "start (s)"}


def test_gpu_time_chart_without_a_capture_start_counts_from_its_window():
    chart = gpu_time_chart(idle([(5 * MS, 6 * MS, None, "outside")]), window(5 * MS, 15 * MS), max_points=40)
    spec = chart.to_dict()
    assert spec["encoding"]["x"]["title"] == "time since the window started (ms)"
    assert spec["encoding"]["x"]["scale"]["domain"] == [0.0, 10.0]
