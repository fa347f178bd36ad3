"""Charts of GPU time: busy and idle over time (gpu_time_idle), idle time by host cause (gpu_time_causes), kernels."""
from __future__ import annotations

import enum

import altair as alt
import pyarrow as pa

from itertrace.dashboards.chart_data import NS_PER_MS, TableLike, as_arrow, sql, sql_text
from itertrace.dashboards.step_marks import step_bands, steps_strip
from itertrace.dashboards.time_axis import time_axis
from itertrace.kernel_names import short_kernel_name

IDLE_COLUMNS = ("device_id", "global_pid", "start_ns", "end_ns", "kind")
WINDOW_COLUMNS = ("device_id", "global_pid", "window_start_ns", "window_end_ns")
CAUSE_COLUMNS = ("cause_kind", "cause", "within_ns", "between_ns", "outside_ns")
KERNEL_COLUMNS = ("kind", "name", "ops", "total_ns", "share", "mean_ns")


class TimeKind(enum.Enum):
    """What a GPU did at an instant: busy, or idle of one of gpu_time_idle's kinds."""

    BUSY = "busy"
    WITHIN = "within"
    BETWEEN = "between"
    OUTSIDE = "outside"


KIND_TITLES = {TimeKind.BUSY: "busy", TimeKind.WITHIN: "idle within an iteration",
               TimeKind.BETWEEN: "idle between iterations", TimeKind.OUTSIDE: "idle outside iterations"}
_KIND_COLOURS = {TimeKind.BUSY: "#54a24b", TimeKind.WITHIN: "#f58518", TimeKind.BETWEEN: "#e45756",
                 TimeKind.OUTSIDE: "#bab0ac"}


def kind_scale(kinds: list[TimeKind] | None = None) -> alt.Scale:
    """Colours of busy and the idle kinds, by their titles."""
    kinds = kinds or list(TimeKind)
    return alt.Scale(domain=[KIND_TITLES[k] for k in kinds], range=[_KIND_COLOURS[k] for k in kinds])


def _kind_rank() -> str:
    """SQL VALUES of (kind, title, rank) in TimeKind's order."""
    return ", ".join(f"({sql_text(k.value)}, {sql_text(KIND_TITLES[k])}, {i})" for i, k in enumerate(TimeKind))


def gpu_time_chart(idle: TableLike, gpu_time: TableLike, *, iterations: TableLike | None = None,
                   origin_ns: int | None = None, max_points: int = 4000, max_steps: int = 500, width_px: int = 760,
                   height_px: int = 160) -> alt.Chart | alt.VConcatChart:
    """Each GPU's window over time, stacked by share busy and idle of each kind (gpu_time_idle and gpu_time).

    The window is cut into equal bins, as many as keep GPUs x kinds x bins under `max_points`; each
    bin shows the share of it the GPU spent busy and idle within, between and outside iterations
    (an idle span across bins counts in each for its part). One row per GPU and process. Times count
    from `origin_ns`, the capture's start (capture_start_ns), else from the window's start. With
    `iterations`, a strip above marks each step's host step and device interval (step_marks.py).
    """
    spans = as_arrow(idle, IDLE_COLUMNS, what="gpu_time_idle").select(list(IDLE_COLUMNS))
    windows = as_arrow(gpu_time, WINDOW_COLUMNS, what="gpu_time").select(list(WINDOW_COLUMNS))
    gpus = max(1, windows.num_rows)
    bins = max(10, max_points // (gpus * len(TimeKind)))
    lo, hi = sql("SELECT min(window_start_ns), max(window_end_ns) FROM g", g=windows).to_pylist()[0].values()
    axis = time_axis(lo, hi, origin_ns, "the window started")
    start, end, unit = axis.field("start"), axis.field("end"), axis.unit
    data = sql(f"""
        WITH w AS (SELECT min(window_start_ns) AS lo, max(window_end_ns) AS hi,
                          greatest(1, ceil((max(window_end_ns) - min(window_start_ns)) / {bins}))::BIGINT AS width
                   FROM g),
             edges AS (SELECT g.device_id, g.global_pid, b.bin, w.lo + b.bin * w.width AS bin_lo,
                              least(w.lo + (b.bin + 1) * w.width, w.hi) AS bin_hi
                       FROM g CROSS JOIN w CROSS JOIN range({bins}) AS b(bin)
                       WHERE w.lo + b.bin * w.width < w.hi),
             cut AS (SELECT s.device_id, s.global_pid, s.kind, s.start_ns, s.end_ns,
                            unnest(range((s.start_ns - w.lo) // w.width, (s.end_ns - 1 - w.lo) // w.width + 1)) AS bin
                     FROM s CROSS JOIN w WHERE s.end_ns > s.start_ns),
             idle AS (SELECT c.device_id, c.global_pid, e.bin, c.kind,
                             sum(least(c.end_ns, e.bin_hi) - greatest(c.start_ns, e.bin_lo)) AS ns
                      FROM cut AS c JOIN edges AS e USING (device_id, global_pid, bin) GROUP BY ALL),
             idle_sums AS (SELECT device_id, global_pid, bin, sum(ns) AS ns FROM idle GROUP BY ALL),
             ranks(kind, title, kind_rank) AS (VALUES {_kind_rank()}),
             grid AS (SELECT e.*, r.* FROM edges AS e CROSS JOIN ranks AS r),
             parts AS (
               SELECT g.device_id, g.global_pid, g.bin_lo, g.bin_hi, g.title, g.kind_rank,
                      CASE WHEN g.kind = 'busy' THEN g.bin_hi - g.bin_lo - coalesce(t.ns, 0) ELSE coalesce(i.ns, 0)
                      END AS ns
               FROM grid AS g
               LEFT JOIN idle AS i USING (device_id, global_pid, bin, kind)
               LEFT JOIN idle_sums AS t USING (device_id, global_pid, bin))
        SELECT 'GPU ' || device_id::VARCHAR || ', pid ' || ((global_pid >> 24) & 16777215)::VARCHAR AS gpu,
               {axis.sql('bin_lo')} AS {start}, {axis.sql('bin_hi')} AS {end}, title AS kind, kind_rank,
               ns / (bin_hi - bin_lo) AS share, ns / {NS_PER_MS} AS ms
        FROM parts
        ORDER BY gpu, {start}, kind_rank""", s=spans, g=windows)
    domain = [(lo - axis.origin_ns) / axis.ns_per_unit, (hi - axis.origin_ns) / axis.ns_per_unit] if lo is not None \
        else None
    bands = step_bands(iterations, axis, max_steps) if iterations is not None and domain else None
    subtitle = [f"share of each of {bins} equal bins of the capture window; hover for a bin's times"]
    if bands is not None:
        subtitle.append("above: each step's host step (light) and device interval (dark), numbered"
                        if bands.num_rows else "no steps to mark: no iteration range was found")
    titles = [KIND_TITLES[k] for k in TimeKind]
    title = alt.Title("GPU time over the capture: busy, and idle by kind", subtitle=subtitle)
    chart = alt.Chart(data).mark_area(interpolate="step-after").encode(
        x=alt.X(f"{start}:Q", title=axis.title, scale=alt.Scale(domain=domain, zero=False, nice=False)
                if domain else alt.Scale(zero=False, nice=False)),
        y=alt.Y("share:Q", stack="zero", title="share of the bin", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", sort=titles, scale=kind_scale(), title=None),
        order=alt.Order("kind_rank:Q"),
        tooltip=[alt.Tooltip("gpu:N"), alt.Tooltip("kind:N"),
                 alt.Tooltip(f"{start}:Q", title=f"bin from ({unit})", format=",.3f"),
                 alt.Tooltip(f"{end}:Q", title=f"bin to ({unit})", format=",.3f"),
                 alt.Tooltip("share:Q", title="share of the bin", format=".1%"),
                 alt.Tooltip("ms:Q", title="time (ms)", format=",.3f")],
    ).properties(width=width_px, height=height_px)
    if gpus > 1:
        chart = chart.encode(row=alt.Row("gpu:N", title=None))
    if bands is None or not bands.num_rows:
        return chart.properties(title=title)
    return alt.vconcat(steps_strip(bands, axis, domain, width_px), chart, spacing=4, title=title).resolve_scale(
        x="shared", color="independent")


def idle_causes_chart(causes: TableLike, *, max_causes: int = 12, width_px: int = 560) -> alt.Chart:
    """The causes that took the most GPU idle time over all GPUs, each bar split by idle kind (gpu_time_causes)."""
    table = as_arrow(causes, CAUSE_COLUMNS, what="gpu_time_causes").select(list(CAUSE_COLUMNS))
    data = sql(f"""
        WITH c AS (SELECT cause || ' (' || cause_kind || ')' AS cause, sum(within_ns) AS within,
                          sum(between_ns) AS between, sum(outside_ns) AS outside
                   FROM t GROUP BY ALL),
             top AS (SELECT *, within + between + outside AS total,
                            row_number() OVER (ORDER BY within + between + outside DESC, cause) AS position
                     FROM c QUALIFY position <= {int(max_causes)}),
             ranks(kind, title, kind_rank) AS (VALUES {_kind_rank()})
        SELECT cause, position, r.title AS kind, r.kind_rank, ns / {NS_PER_MS} AS ms, total / {NS_PER_MS} AS total_ms
        FROM top UNPIVOT (ns FOR kind IN (within, between, outside)) AS u JOIN ranks AS r USING (kind)
        WHERE ns > 0 ORDER BY position, kind_rank""", t=table)
    order = [r["cause"] for r in sql("SELECT DISTINCT cause, position FROM d ORDER BY position", d=data).to_pylist()]
    idle_kinds = [TimeKind.WITHIN, TimeKind.BETWEEN, TimeKind.OUTSIDE]
    return alt.Chart(data, title=alt.Title("What the host was doing while the GPU sat idle",
                                           subtitle="the causes that took the most idle time, over all GPUs")).mark_bar(
    ).encode(
        x=alt.X("ms:Q", stack="zero", title="GPU idle time (ms)"),
        y=alt.Y("cause:N", sort=order, title=None, axis=alt.Axis(labelLimit=360)),
        color=alt.Color("kind:N", sort=[KIND_TITLES[k] for k in idle_kinds], scale=kind_scale(idle_kinds), title=None),
        order=alt.Order("kind_rank:Q"),
        tooltip=[alt.Tooltip("cause:N"), alt.Tooltip("kind:N"), alt.Tooltip("ms:Q", title="idle (ms)", format=",.3f"),
                 alt.Tooltip("total_ms:Q", title="all of its idle time (ms)", format=",.3f")],
    ).properties(width=width_px, height=max(60, 22 * len(order)))


def kernels_chart(kernels: TableLike, *, max_kernels: int = 15, width_px: int = 560) -> alt.Chart:
    """The GPU operations that took the most time, by short name (short_kernel_name), the full one in the tooltip
    (gpu_time_kernels)."""
    table = as_arrow(kernels, KERNEL_COLUMNS, what="gpu_time_kernels").select(list(KERNEL_COLUMNS))
    data = sql(f"""
        SELECT kind, name, ops, total_ns / {NS_PER_MS} AS total_ms, share, mean_ns / {NS_PER_MS} AS mean_ms,
               row_number() OVER (ORDER BY total_ns DESC, name) AS position
        FROM t QUALIFY position <= {int(max_kernels)} ORDER BY position""", t=table)
    data = data.append_column("label", pa.array(distinct_labels(
        [short_kernel_name(n) for n in data.column("name").to_pylist()]), pa.string()))
    return alt.Chart(data, title=alt.Title("GPU operations by time",
                                           subtitle="summed durations, over all GPUs")).mark_bar().encode(
        x=alt.X("total_ms:Q", title="time (ms)"),
        y=alt.Y("label:N", sort=alt.EncodingSortField("position"), title=None, axis=alt.Axis(labelLimit=420)),
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=["kernel", "memcpy", "memset"],
                                                              range=["#4c78a8", "#72b7b2", "#b279a2"])),
        tooltip=[alt.Tooltip("label:N", title="short name"), alt.Tooltip("name:N", title="full name"),
                 alt.Tooltip("kind:N"), alt.Tooltip("ops:Q", format=","),
                 alt.Tooltip("total_ms:Q", title="time (ms)", format=",.3f"),
                 alt.Tooltip("share:Q", title="share of all GPU operation time", format=".1%"),
                 alt.Tooltip("mean_ms:Q", title="mean (ms)", format=",.4f")],
    ).properties(width=width_px, height=max(60, 22 * data.num_rows))


def distinct_labels(labels: list[str]) -> list[str]:
    """`labels` with each repeat numbered ('reduce_kernel (variant 2)'), so that each stays its own bar or row."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} (variant {seen[label]})")
    return out
