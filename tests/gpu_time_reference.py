"""GPU time accounted in plain Python, one elementary interval at a time: the tests' second computation.

The SQL (queries/gpu_time.sql, host_activity.sql) works with sorts, running windows and ASOF joins;
this walks every interval between two consecutive boundaries and asks, of each, whether a GPU
operation covers it, which iteration it lies in, and which host interval in flight wins. The rules
are the same (the SQL's Notes state them); the way of computing is not.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

NVTX, CUDA = 0, 1  # levels of host interval: an NVTX leaf wins over a CUDA API call


@dataclass(frozen=True)
class HostInterval:
    """An NVTX leaf range or a CUDA API call of a thread, and the thread's claim to win."""

    tid: int
    start_ns: int
    end_ns: int
    level: int  # NVTX or CUDA
    launches: int  # GPU operations the thread launched: more wins
    cause_kind: str  # 'nvtx', 'cuda_sync', ...
    cause: str

    @property
    def rank(self) -> tuple[int, int, int]:
        return self.level, -self.launches, self.tid


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, until = 0, None
    for start, end in sorted(intervals):
        if until is None or start > until:
            total += end - start
            until = end
        elif end > until:
            total += end - until
            until = end
    return total


def accounting(window: tuple[int, int], ops: list[tuple[int, int]], iterations: list[tuple[int, int, int | None]],
               host: list[HostInterval]) -> tuple[int, Counter, Counter]:
    """(busy ns, idle ns by kind, idle ns by (kind, cause_kind, cause)) of one GPU over `window`.

    `ops` are its GPU operations' [start, end); `iterations` the process's device intervals as
    (start, end, iteration); `host` the process's host intervals.
    """
    lo, hi = window
    points = {lo, hi}
    for start, end in ops:
        points |= {start, end}
    for start, end, _ in iterations:
        points |= {start, end}
    for h in host:
        points |= {h.start_ns, h.end_ns}
    points = sorted(p for p in points if lo <= p <= hi)
    first = min((s for s, _, _ in iterations), default=None)
    last = max((e for _, e, _ in iterations), default=None)
    busy, by_kind, by_cause = 0, Counter(), Counter()
    for a, b in zip(points, points[1:]):
        if any(s <= a and b <= e for s, e in ops):
            busy += b - a
            continue
        if any(s <= a and b <= e for s, e, _ in iterations):
            kind = "within"
        elif first is not None and first <= a and b <= last:
            kind = "between"
        else:
            kind = "outside"
        by_kind[kind] += b - a
        flying = [h for h in host if h.start_ns <= a and b <= h.end_ns]
        if flying:
            won = min(flying, key=lambda h: h.rank)
            by_cause[kind, won.cause_kind, won.cause] += b - a
        else:
            by_cause[kind, "unattributed", "unattributed"] += b - a
    return busy, by_kind, by_cause


def leaves(ranges: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int, str]]:
    """The (tid, start, end, name) ranges, given in range_id order, that hold no other range of the list on
    their thread; of two ranges with the same start and end, the later one is inside the earlier (as a
    push inside a push), and a range of no length holds nothing and is inside nothing (it takes no time)."""
    def inside(i: int, j: int) -> bool:
        (tid, start, end, _), (outer_tid, outer_start, outer_end, _) = ranges[i], ranges[j]
        return (i != j and tid == outer_tid and start < end and outer_start <= start < outer_end
                and end <= outer_end and (start, -end, i) > (outer_start, -outer_end, j))
    return [r for i, r in enumerate(ranges) if not any(inside(k, i) for k in range(len(ranges)))]


def clipped_calls(calls: list[tuple[int, int, int, str, int]]) -> list[tuple[int, int, int, str]]:
    """(tid, start, end, name, api_id) calls cut to what earlier calls on their thread (by start, longest
    first, then api_id) leave uncovered, as (tid, start, end, name)."""
    out, covered = [], {}
    for tid, start, end, name, _ in sorted(calls, key=lambda c: (c[0], c[1], -c[2], c[4])):
        begin = max(start, covered.get(tid, start))
        if end > begin:
            out.append((tid, begin, end, name))
        covered[tid] = max(covered.get(tid, end), end)
    return out


def api_class(name: str) -> str:
    """The cause_kind of a CUDA or HIP API function, by host_activity.sql's rule."""
    prefix = next((p for p in ("cuda", "hip", "cu") if name.startswith(p)), None)
    if prefix is None:
        return "cuda_other"
    bare = name[len(prefix):]
    if bare.startswith(("DeviceSynchronize", "StreamSynchronize", "EventSynchronize", "CtxSynchronize",
                        "ThreadSynchronize")) or (bare.startswith("Memcpy") and "Async" not in name):
        return "cuda_sync"
    if bare.startswith("GraphLaunch"):
        return "cuda_graph_launch"
    for launch in ("Launch", "ExtLaunch", "HccLaunch", "ModuleLaunch", "ExtModuleLaunch", "HccModuleLaunch"):
        if bare.startswith(launch):
            return "cuda_launch"
    if bare.startswith("Memcpy"):
        return "cuda_memcpy"
    if bare.startswith("Memset"):
        return "cuda_memset"
    return "cuda_other"
