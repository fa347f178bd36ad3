"""GPU time on the real PyTorch profiler traces (../shared/kineto_samples/): each GPU's window is the profiler's
own span (its Trace event) widened to hold the GPU's work, busy time is the union of that work, and both agree
with figures computed outside itertrace and with Holistic Trace Analysis where its definitions are the same."""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from itertrace.ingest import ingest
from itertrace.queries import QueryDB

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "kineto_samples"

# Per file: (device, GPU ops, busy ns) from the union of its kernels, copies and sets computed from the JSON
# with exact decimal times, outside itertrace; and HTA 0.5.0's temporal breakdown (HTA_DISABLE_NS_ROUNDING=1,
# one trace_dir per file): idle us over its kernel_time us, its window being the GPU work's first start to last
# end. Where HTA's idle differs from the union's over that window, the reason: it counts cuda_sync events that
# carry a stream (Stream Sync, Stream Wait Event) as busy, and it drops the GPU work launched after the last
# ProfilerStep starts; both checked by recomputing the union its way. cpu_only_rank34 has no GPU work (HTA fails
# on it with an IndexError).
FIGURES = {
    "alexnet_sync": (0, 98, 66_141_000, 12_929_684.0, 12_996_011.0, "HTA counts cuda_sync events as busy"),
    "amd_mi250_rocm62": (2, 16, 149_042, 8_762.845, 8_911.887, None),
    "event_sync": (0, 5, 51_000, 207.0, 263.0, "HTA counts cuda_sync events as busy"),
    "event_sync_multi_stream": (0, 6, 372_000, 19_132.0, 19_506.0, "HTA counts cuda_sync events as busy"),
    "resnet_v100_ns_rank0": (0, 6_095, 472_454_441, 6_452.761, 384_634.523, "HTA drops the last ProfilerStep"),
    "sampled_rank0": (0, 1_204, 547_656_000, 321_378.0, 600_058.0, "HTA drops the last ProfilerStep"),
    "tiny_inference_rank1": (0, 4, 30_000, 1_599.0, 1_629.0, None),
    "trace_diff_control": (3, 9_450, 388_587_000, 62_119.0, 383_404.0, "HTA drops the last ProfilerStep"),
}


def _events(path: Path) -> list[dict]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _ns(us: Decimal) -> int:
    return int(Decimal(us) * 1000)


def _gpu(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X"
            and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset")]


def _union(intervals: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(first start, last end, length of the union) of [start, end) intervals."""
    busy, until = 0, None
    for start, end in sorted(intervals):
        busy += max(0, end - max(start, until if until is not None else start))
        until = end if until is None else max(until, end)
    return min(a for a, _ in intervals), max(b for _, b in intervals), busy


def spans(path: Path) -> tuple[int, int, int, int]:
    """(the Trace event's start, its end, the first GPU start, the last GPU end), in ns, from the JSON alone."""
    events = _events(path)
    trace = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events if e.get("cat") == "Trace" and e.get("ph") == "X"]
    gpu = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in _gpu(events)]
    return (min(a for a, _ in trace), max(b for _, b in trace), min(a for a, _ in gpu), max(b for _, b in gpu))


def hta_like(path: Path, why: str) -> tuple[float, float]:
    """(idle us, window us) of the union taken HTA's way, to check the reason it differs: with the cuda_sync
    events that carry a stream, or only of the work launched before the last ProfilerStep starts."""
    events = _events(path)
    work = _gpu(events)
    if "cuda_sync" in why:
        work += [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_sync"
                 and int((e.get("args") or {}).get("stream", -1)) >= 0]
    else:
        last_step = max(_ns(e["ts"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
        launched = {(e.get("args") or {}).get("correlation"): _ns(e["ts"]) for e in events if e.get("ph") == "X"
                    and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver", "runtime")}
        work = [e for e in work if launched.get((e.get("args") or {}).get("correlation"), last_step) < last_step]
    first, last, busy = _union([(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in work])
    return (last - first - busy) / 1000, (last - first) / 1000


@pytest.mark.shared
@pytest.mark.parametrize("name", FIGURES)
def test_busy_share_is_the_union_over_the_profilers_span(tmp_path, name):
    path = SAMPLES / f"{name}.json.gz"
    if not path.exists():
        pytest.skip(f"the Kineto samples are not at {SAMPLES}")
    device, ops, busy, hta_idle_us, hta_window_us, why = FIGURES[name]
    ingest([path], tmp_path / "trace.duckdb")
    with QueryDB(tmp_path / "trace.duckdb") as q:
        (row,) = q.query("gpu_time").to_pylist()
        (summary,) = q.query("gpu_time_summary").to_pylist()
    trace_start, trace_end, first, last = spans(path)
    shift = row["window_start_ns"] - min(trace_start, first)  # the ingest may count from another instant
    assert (row["device_id"], row["gpu_ops"], row["busy_ns"]) == (device, ops, busy)
    assert (row["window_start_ns"] - shift, row["window_end_ns"] - shift) == (min(trace_start, first),
                                                                              max(trace_end, last))
    assert row["window_source"] == summary["window_source"] == "kineto trace span"
    assert summary["busy_share"] == busy / row["window_ns"]
    assert row["window_ns"] == row["busy_ns"] + row["idle_within_ns"] + row["idle_between_ns"] + row["idle_outside_ns"]
    # HTA's window is the GPU work's first start to last end; over it, HTA's idle is the union's idle
    gpu_idle_us = (last - first - busy) / 1000
    expected = (gpu_idle_us, (last - first) / 1000) if why is None else hta_like(path, why)
    assert abs(expected[0] - hta_idle_us) < 0.1 and abs(expected[1] - hta_window_us) < 0.1, why
