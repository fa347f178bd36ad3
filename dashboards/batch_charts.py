"""Charts of the run log's batches over runs: active tokens per iteration, and stranded slot-time."""
from __future__ import annotations

import altair as alt
import pyarrow as pa

from itertrace.dashboards.chart_data import TableLike, as_arrow, bin_width, iteration_axis, labels_in_order, sql
from itertrace.dashboards.membership import STATE_TITLES, STATES, state_scale

_TOKEN_TICKS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]

MEMBERSHIP_ITERATIONS_COLUMNS = ("iteration", "capacity", "working", "finished", "stalled", "empty", "active_tokens")
SLOT_TIME_COLUMNS = ("iterations", "slot_iterations", "working", "finished", "stalled", "empty", "idle_share")


def active_tokens_chart(iterations: TableLike, *, label: str = "run", max_points: int = 3000, symlog_y: bool = True,
                        overlay: bool | None = None, width_px: int = 760,
                        height_px: int = 260) -> alt.LayerChart | alt.FacetChart:
    """Active tokens per iteration of several runs on the same axes (membership_iterations plus a `label` column).

    With `overlay` (by default, for up to two runs) the runs' lines share one panel; otherwise each
    run gets a row of its own, all rows on the same scales. A symlog y axis (`symlog_y`) keeps a
    few decode tokens readable beside prefill spikes of hundreds.
    When the longest run has more iterations than `max_points` shared among the runs, iterations
    are binned (the same edges for every run) so that all runs together embed at most `max_points`
    rows: the line is each bin's mean, the band its min to max.
    """
    table = as_arrow(iterations, (label, *MEMBERSHIP_ITERATIONS_COLUMNS), what="membership_iterations")
    columns = list(MEMBERSHIP_ITERATIONS_COLUMNS)
    table = table.select([label, *columns]).rename_columns(["run", *columns])
    runs = labels_in_order(table, "run")
    longest = max([int(r["n"]) for r in sql("SELECT count(*) AS n FROM t GROUP BY run", t=table).to_pylist()] or [0])
    width = bin_width(longest, max(50, max_points // max(1, len(runs))))
    data = sql(f"""
        SELECT run, iteration // {width} * {width} AS iteration, count(*) AS iterations,
               avg(active_tokens) AS active_tokens, min(active_tokens) AS min_tokens, max(active_tokens) AS max_tokens,
               avg(working) AS working, avg(finished) AS finished, avg(empty) AS empty, max(capacity) AS capacity
        FROM t GROUP BY run, iteration // {width} ORDER BY run, iteration""", t=table)
    colour = alt.Color("run:N", sort=runs, title=label, scale=alt.Scale(scheme="tableau10"),
                       legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=3, symbolOpacity=1))
    mean = "" if width == 1 else "mean "
    tip = [alt.Tooltip("run:N", title=label),
           alt.Tooltip("iteration:Q", title="iteration" if width == 1 else "from iteration"),
           alt.Tooltip("active_tokens:Q", title=f"{mean}active tokens", format=",.1f"),
           alt.Tooltip("working:Q", title=f"{mean}working slots", format=".1f"),
           alt.Tooltip("finished:Q", title=f"{mean}slots held by finished", format=".1f"),
           alt.Tooltip("empty:Q", title=f"{mean}empty slots", format=".1f")]
    top = max([r or 0 for r in data.column("max_tokens").to_pylist()] or [0])
    x = alt.X("iteration:Q", title="iteration", axis=iteration_axis(width_px), scale=alt.Scale(nice=False))
    y_scale = alt.Scale(type="symlog") if symlog_y else alt.Scale()
    together = overlay if overlay is not None else len(runs) <= 2
    ticks = [t for t in _TOKEN_TICKS if t <= top and (together or t == 0 or str(t).startswith("1"))]
    y_axis = alt.Axis(values=ticks, labelOverlap=False) if symlog_y else alt.Axis()
    y_title = "active tokens (prefill + decode)" if together else "active tokens"
    y = alt.Y("active_tokens:Q", title=y_title, scale=y_scale, axis=y_axis)
    base = alt.Chart()
    layers = [base.mark_line(interpolate="step-after", strokeWidth=1.5).encode(x=x, y=y, color=colour, tooltip=tip),
              base.mark_point(size=20, opacity=0).encode(x=x, y=y, color=colour, tooltip=tip)]
    subtitle = "tokens each iteration ran, per run"
    if width > 1 and len(runs) <= 2:
        layers.insert(0, base.mark_area(opacity=0.2, interpolate="step-after").encode(
            x=x, y=alt.Y("min_tokens:Q", scale=y_scale, axis=y_axis, title=y_title), y2="max_tokens:Q", color=colour))
        subtitle = f"bins of {width} iterations: line the mean, band min to max"
    elif width > 1:
        subtitle = f"bins of {width} iterations: the mean of each bin"
    title = alt.Title("Active tokens per iteration", subtitle=subtitle)
    if together:
        return alt.layer(*layers, data=data, title=title).properties(width=width_px, height=height_px)
    return alt.layer(*layers, data=data).properties(width=width_px, height=max(80, height_px // 2)).facet(
        row=alt.Row("run:N", sort=runs, title=None,
                    header=alt.Header(labelOrient="top", labelAnchor="start", labelFontWeight="bold")),
        title=title)


def slot_time_chart(slot_time: TableLike, *, workload: str | None = "workload", mode: str = "mode",
                    width_px: int = 640) -> alt.FacetChart | alt.LayerChart:
    """Slot-iterations by what the slots did, per workload and mode (membership_slot_time plus a `workload` column).

    One bar per row of the input (y: the `mode` column; a panel per `workload` value unless that is
    None), four segments each: always small, nothing to reduce.
    """
    needed = (*((workload,) if workload else ()), mode, *SLOT_TIME_COLUMNS)
    table = as_arrow(slot_time, needed, what="membership_slot_time").select(list(needed))
    if not workload:
        table = table.add_column(0, "workload", pa.array([""] * table.num_rows, pa.string()))
    table = table.rename_columns(["workload", "mode", *SLOT_TIME_COLUMNS])
    order = ", ".join(f"('{s}', {i}, '{STATE_TITLES[s]}')" for i, s in enumerate(STATES))
    data = sql(f"""
        WITH long AS (UNPIVOT t ON {', '.join(STATES)} INTO NAME kind VALUE slot_iterations_kind),
             kinds(kind, kind_rank, kind_title) AS (VALUES {order})
        SELECT workload, mode, kind_title, kind_rank, slot_iterations_kind AS value,
               slot_iterations_kind / nullif(slot_iterations, 0) AS share,
               sum(slot_iterations_kind) OVER (PARTITION BY workload, mode ORDER BY kind_rank) AS x_hi,
               slot_iterations, iterations, idle_share
        FROM long JOIN kinds USING (kind) ORDER BY workload, mode, kind_rank""", t=table)
    modes = labels_in_order(table, "mode")
    rows = max([r["n"] for r in sql("SELECT count(*) AS n FROM t GROUP BY workload", t=table).to_pylist()] or [1])
    y = alt.Y("mode:N", title=None, sort=modes)
    tip = [alt.Tooltip("workload:N"), alt.Tooltip("mode:N", title=mode), alt.Tooltip("kind_title:N", title="slots"),
           alt.Tooltip("value:Q", title="slot-iterations", format=","), alt.Tooltip("share:Q", format=".1%"),
           alt.Tooltip("iterations:Q", format=",")]
    base = alt.Chart().transform_calculate(
        x_lo="datum.x_hi - datum.value",
        note="'idle ' + format(datum.idle_share, '.0%') + ', ' + format(datum.iterations, ',') + ' iterations'")
    bars = base.mark_bar(height=22).encode(
        x=alt.X("x_lo:Q", title="slot-iterations (capacity x iterations that ran)",
                axis=alt.Axis(format="~s", tickCount=6, labelOverlap="greedy")),
        x2="x_hi:Q", y=y,
        color=alt.Color("kind_title:N", title="slots", scale=state_scale(STATES)), tooltip=tip)
    text = base.transform_filter(f"datum.kind_rank == {len(STATES) - 1}").mark_text(
        align="left", dx=4, fontSize=11).encode(x="x_hi:Q", y=y, text="note:N")
    layer = alt.layer(bars, text, data=data).properties(width=width_px, height=30 * rows)
    title = alt.Title("Slot-time by what the slots did",
                      subtitle="dark grey: slots held by finished requests (stranded slot-time)")
    if workload:
        return layer.facet(row=alt.Row("workload:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
                           title=title).resolve_scale(y="independent")
    return layer.properties(title=title)
