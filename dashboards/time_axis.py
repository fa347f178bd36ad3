"""Time axes: instants counted from the capture's start, in milliseconds or, for a long capture, seconds.

An nsys export counts every time from its session start, so the capture starts at 0. A PyTorch
profiler trace keeps its profiler's clock, Unix time or a clock since the machine booted (below its
baseTimeNanoseconds), so its capture starts at the earliest instant it recorded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from itertrace.dashboards.chart_data import NS_PER_MS

if TYPE_CHECKING:
    from itertrace.queries.api import QueryDB

NS_PER_S = 1_000_000_000
SECONDS_FROM_NS = 20 * NS_PER_S  # an axis this long or longer counts in seconds

# The tables holding a capture's instants, and their time columns.
_INSTANTS = (("gpu_ops", "start_ns"), ("cuda_api", "start_ns"), ("nvtx_ranges", "start_ns"), ("nvtx_marks", "ts_ns"))


@dataclass(frozen=True)
class TimeAxis:
    """Instants on a chart: `origin_ns` is shown as 0, the rest in `unit` ('ms' or 's') from it."""

    origin_ns: int
    unit: str = "ms"
    since: str = "the capture started"

    @property
    def ns_per_unit(self) -> int:
        return NS_PER_S if self.unit == "s" else NS_PER_MS

    @property
    def title(self) -> str:
        return f"time since {self.since} ({self.unit})"

    def sql(self, column: str) -> str:
        """SQL of `column` (ns) as a double on this axis."""
        return f"({column} - {self.origin_ns}) / {self.ns_per_unit}"

    def field(self, name: str) -> str:
        """A column name with this axis's unit, e.g. `start_ms`."""
        return f"{name}_{self.unit}"


def time_axis(first_ns: int | None, last_ns: int | None, origin_ns: int | None,
              unnamed: str = "the first instant shown") -> TimeAxis:
    """The axis of a chart whose instants run from `first_ns` to `last_ns`: from `origin_ns`, the capture's start
    (capture_start_ns), or where the caller gives none, from `first_ns`, which the title calls `unnamed`."""
    origin, since = (origin_ns, "the capture started") if origin_ns is not None else (first_ns or 0, unnamed)
    end = (last_ns if last_ns is not None else origin) - origin
    return TimeAxis(origin, "s" if end >= SECONDS_FROM_NS else "ms", since)


def capture_start_ns(db: QueryDB) -> int:
    """When the database's capture started, on its own clock: 0 for nsys (its times count from the session
    start); for a PyTorch profiler trace (kineto_sources), the earliest instant it recorded."""
    tables = db.tables()
    if "kineto_sources" not in tables:
        return 0
    parts = [f"SELECT min({column}) AS t FROM {table}" for table, column in _INSTANTS if table in tables]
    if not parts:
        return 0
    first = db.sql(f"SELECT min(t) AS t FROM ({' UNION ALL '.join(parts)})").column(0)[0].as_py()
    return int(first) if first is not None else 0
