"""Overlap off against on: the two runs' timelines one above the other, on one time scale, so the closed gaps show.

Each timeline has two lanes over the same window of iterations: the host lane, the engine thread's
host-phase leaves (host_gaps.sql's `host_gaps_leaves`, coloured by phase), and the device lane,
each iteration's device interval (`iterations`). Times count from the window's first step start, so
the run with overlap, whose iterations come closer together, ends further left.
"""
from __future__ import annotations

import json

import altair as alt
import pyarrow as pa

from itertrace.dashboards.blocks import ChartBlock, RunData, Section
from itertrace.dashboards.chart_data import NS_PER_MS, sql
from itertrace.dashboards.trace_charts import phase_scale, sort_phases

FIRST_ITERATION = 8  # past the prefill of the first batch: steady decode iterations
WINDOW_ITERATIONS = 10
LANES = ("host", "device")


def overlap_lanes(db, first_iteration: int = FIRST_ITERATION, count: int = WINDOW_ITERATIONS) -> pa.Table:
    """One row per bar: lane, phase, start_ms and end_ms since the window's first step start (`db`: a capture's QueryDB)."""
    lo, hi = int(first_iteration), int(first_iteration) + int(count)
    return db.sql(f"""
        WITH
          win AS (SELECT min(host_start_ns) AS t0, max(host_end_ns) AS t1 FROM iterations
                  WHERE iteration >= {lo} AND iteration < {hi}),
          names AS (SELECT DISTINCT phase_rank, phase FROM host_gaps_phase_names),
          bars AS (
            SELECT 'device' AS lane, 'device interval' AS phase, device_start_ns AS s, device_end_ns AS e
            FROM iterations WHERE iteration >= {lo} AND iteration < {hi} AND device_start_ns IS NOT NULL
            UNION ALL
            SELECT 'host', n.phase, greatest(l.start_ns, w.t0), least(l.end_ns, w.t1)
            FROM host_gaps_leaves AS l JOIN names AS n USING (phase_rank), win AS w
            WHERE l.start_ns < w.t1 AND l.end_ns > w.t0 AND n.phase <> 'forward')
        SELECT lane, phase, (s - w.t0) / {NS_PER_MS} AS start_ms, (e - w.t0) / {NS_PER_MS} AS end_ms,
               (e - s) / {NS_PER_MS} AS dur_ms
        FROM bars, win AS w ORDER BY lane, s""")


def overlap_timelines_chart(off: pa.Table, on: pa.Table, *, first_iteration: int = FIRST_ITERATION,
                            count: int = WINDOW_ITERATIONS, width_px: int = 760) -> alt.VConcatChart:
    """The run without overlap above the run with it (overlap_lanes of each), sharing the time axis and colours."""
    phases = sort_phases([p for t in (off, on) for p in t.column("phase").to_pylist() if p != "device interval"])
    colours = phase_scale(phases)
    scale = alt.Scale(domain=[*colours.domain, "device interval"], range=[*colours.range, "#b279a2"])
    end = max([0.0, *off.column("end_ms").to_pylist(), *on.column("end_ms").to_pylist()])

    def one(table: pa.Table, title: str) -> alt.Chart:
        return alt.Chart(sql("SELECT * FROM t", t=table), title=title).mark_bar(
            stroke="white", strokeWidth=0.3).encode(
            x=alt.X("start_ms:Q", title="time since the window's first step started (ms)",
                    scale=alt.Scale(domain=[0, end], nice=False)),
            x2="end_ms:Q",
            y=alt.Y("lane:N", sort=list(LANES), title=None),
            color=alt.Color("phase:N", scale=scale, title="host phase / device"),
            tooltip=[alt.Tooltip("lane:N"), alt.Tooltip("phase:N"),
                     alt.Tooltip("start_ms:Q", title="start (ms)", format=",.3f"),
                     alt.Tooltip("dur_ms:Q", title="duration (ms)", format=",.3f")],
        ).properties(width=width_px, height=70)

    return alt.vconcat(one(off, "without overlap"), one(on, "with overlap")).resolve_scale(x="shared").properties(
        title=alt.Title(f"Host phases and device intervals, iterations {first_iteration} to "
                        f"{first_iteration + count - 1}",
                        subtitle="white space in a device lane is a host gap; with overlap the host phases that overlap "
                                 "mode hides run while the device computes"))


def _overlap_flag(run: RunData) -> bool | None:
    """The run's --overlap from its run log's configuration; None without a log."""
    if not run.meta or not run.meta.get("config_json"):
        return None
    return bool(json.loads(run.meta["config_json"]).get("overlap"))


def overlap_section(runs: list[RunData]) -> Section | None:
    """The timelines of the first traced run without overlap and the first with it; None unless the report has both."""
    traced = [r for r in runs if r.has_trace and r.iterations_in_trace]
    off = next((r for r in traced if _overlap_flag(r) is False), None)
    on = next((r for r in traced if _overlap_flag(r) is True), None)
    if off is None or on is None:
        return None
    shortest = min(off.iterations_in_trace, on.iterations_in_trace)
    first = FIRST_ITERATION if shortest >= FIRST_ITERATION + WINDOW_ITERATIONS else 0  # a short run: its start
    count = min(WINDOW_ITERATIONS, shortest - first)
    chart = overlap_timelines_chart(overlap_lanes(off.db, first, count), overlap_lanes(on.db, first, count),
                                    first_iteration=first, count=count)
    return Section("overlap", "Overlap off and on",
                   f"The same iterations of {off.label} (without overlap) above {on.label} (with it), from their "
                   "captures, on one time scale from each window's first step start.",
                   [ChartBlock("overlap-timelines", chart,
                               "Host lane: the engine thread's host-phase ranges; device lane: each iteration's "
                               "forward pass.")])
