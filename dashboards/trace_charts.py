"""Charts of the nsys trace: host gaps by phase (host_gaps_parts) and the iteration timeline (iterations)."""
from __future__ import annotations

import altair as alt
import pyarrow as pa

from itertrace.dashboards.chart_data import (
    NS_PER_MS,
    TableLike,
    as_arrow,
    bin_width,
    iteration_axis,
    iteration_span,
    sql,
    sql_text,
)
from itertrace.dashboards.time_axis import time_axis

UNATTRIBUTED = "unattributed"
OTHER_PHASES = "other phases"
# Host phases in the order they fill a gap: after the device interval ends, sampling and the rest of
# the step; then the next step's scheduling and preparation until its device work starts.
PHASE_ORDER = ("sample", "detokenize", "postprocess", "schedule", "prepare", "forward")
_PHASE_COLOURS = {"sample": "#4c78a8", "detokenize": "#72b7b2", "postprocess": "#54a24b", "schedule": "#f58518",
                  "prepare": "#e45756", "forward": "#b279a2"}
_MORE_COLOURS = ("#9d755d", "#eeca3b", "#ff9da6", "#bab0ac", "#79706e", "#d67195", "#83bcb6", "#b6992d")
_UNATTRIBUTED_COLOUR = "#3b3b3b"
_OTHER_COLOUR = "#c7c7c7"

PARTS_COLUMNS = ("global_tid", "iteration", "phase", "dur_ns")
ITERATIONS_COLUMNS = ("iteration", "global_tid", "host_start_ns", "host_end_ns", "device_start_ns", "device_end_ns")


def phase_scale(phases: list[str]) -> alt.Scale:
    """Colours for host phases: fixed for this engine's phases, dark grey for unattributed."""
    ordered = sort_phases(phases)
    extra = iter(_MORE_COLOURS * (len(ordered) // len(_MORE_COLOURS) + 1))
    colours = [_UNATTRIBUTED_COLOUR if p == UNATTRIBUTED else _OTHER_COLOUR if p == OTHER_PHASES
               else _PHASE_COLOURS.get(p) or next(extra) for p in ordered]
    return alt.Scale(domain=ordered, range=colours)


def sort_phases(phases: list[str]) -> list[str]:
    """Phases in gap order: this engine's phases, then others by name, then `other phases`, then unattributed."""
    rank = {p: i for i, p in enumerate(PHASE_ORDER)}
    last = {OTHER_PHASES: 1, UNATTRIBUTED: 2}
    return sorted(set(phases), key=lambda p: (last.get(p, 0), rank.get(p, len(rank)), p))


def _lumped_parts(parts: TableLike, max_phases: int) -> pa.Table:
    """host_gaps_parts with all but the `max_phases` largest phases (by total time) summed as `other phases`."""
    table = as_arrow(parts, PARTS_COLUMNS, what="host_gaps_parts").select(list(PARTS_COLUMNS))
    return sql(f"""
        WITH totals AS (SELECT phase, sum(dur_ns) AS total FROM t WHERE phase <> '{UNATTRIBUTED}' GROUP BY phase),
             kept AS (SELECT phase FROM totals ORDER BY total DESC, phase LIMIT {int(max_phases)})
        SELECT global_tid, iteration,
               CASE WHEN phase = '{UNATTRIBUTED}' OR phase IN (SELECT phase FROM kept) THEN phase
                    ELSE '{OTHER_PHASES}' END AS phase,
               sum(dur_ns)::BIGINT AS dur_ns
        FROM t GROUP BY ALL""", t=table)


def host_gap_iterations_chart(parts: TableLike, *, max_rows: int = 4000, max_phases: int = 10,
                              width_px: int = 760, height_px: int = 220) -> alt.Chart:
    """Per iteration, its gap stacked by host phase, `unattributed` on top (from host_gaps_parts).

    Phases beyond the `max_phases` largest are summed as `other phases`. When iterations x phases x
    tracks exceed `max_rows`, consecutive iterations are binned (equal widths, as few bins as fit)
    and each bar shows a bin's mean gap per phase, with the bin's total and longest gap in the tooltip.
    """
    table = _lumped_parts(parts, max_phases)
    phases = sort_phases(table.column("phase").to_pylist()) if table.num_rows else [UNATTRIBUTED]
    tracks = len(set(table.column("global_tid").to_pylist()))
    width = bin_width(iteration_span(table), max_rows // max(1, len(phases) * tracks))
    rank = ", ".join(f"({sql_text(p)}, {i})" for i, p in enumerate(phases))
    data = sql(f"""
        WITH p AS (SELECT *, (iteration - (SELECT min(iteration) FROM t)) // {width} AS bin FROM t),
             gaps AS (SELECT global_tid, bin, iteration, sum(dur_ns) AS gap_ns FROM p GROUP BY ALL),
             bins AS (SELECT global_tid, bin, count(*) AS gaps, sum(gap_ns) AS total_ns, max(gap_ns) AS max_ns,
                             min(iteration) AS first_iteration, max(iteration) AS last_iteration
                      FROM gaps GROUP BY ALL),
             sums AS (SELECT global_tid, bin, phase, sum(dur_ns) AS dur_ns FROM p GROUP BY ALL),
             ranks(phase, phase_rank) AS (VALUES {rank})
        SELECT 'thread ' || s.global_tid::VARCHAR AS track, s.phase, r.phase_rank,
               b.first_iteration, b.last_iteration,
               b.first_iteration AS x_lo, b.first_iteration + {width} AS x_hi,
               s.dur_ns / b.gaps / {NS_PER_MS} AS mean_ms,
               (sum(s.dur_ns) OVER stack - s.dur_ns) / b.gaps / {NS_PER_MS} AS y_lo,
               sum(s.dur_ns) OVER stack / b.gaps / {NS_PER_MS} AS y_hi,
               b.total_ns / b.gaps / {NS_PER_MS} AS gap_mean_ms, b.max_ns / {NS_PER_MS} AS gap_max_ms,
               b.total_ns / {NS_PER_MS} AS gap_total_ms, b.gaps
        FROM sums s JOIN bins b USING (global_tid, bin) JOIN ranks r USING (phase)
        WINDOW stack AS (PARTITION BY s.global_tid, s.bin ORDER BY r.phase_rank)
        ORDER BY track, x_lo, phase_rank""", t=table)
    if width == 1:
        title = "Host gap before each iteration, by host phase"
        tooltip = [alt.Tooltip("first_iteration:Q", title="gap before iteration"),
                   alt.Tooltip("phase:N"), alt.Tooltip("mean_ms:Q", title="phase (ms)", format=".3f"),
                   alt.Tooltip("gap_mean_ms:Q", title="whole gap (ms)", format=".3f")]
        y_title = "gap (ms)"
    else:
        title = f"Host gap per iteration by host phase: mean over bins of {width} iterations"
        tooltip = [alt.Tooltip("first_iteration:Q", title="from iteration"),
                   alt.Tooltip("last_iteration:Q", title="to iteration"), alt.Tooltip("phase:N"),
                   alt.Tooltip("mean_ms:Q", title="phase, mean per gap (ms)", format=".3f"),
                   alt.Tooltip("gap_mean_ms:Q", title="mean gap (ms)", format=".3f"),
                   alt.Tooltip("gap_max_ms:Q", title="longest gap (ms)", format=".3f"),
                   alt.Tooltip("gap_total_ms:Q", title="all gaps in bin (ms)", format=",.1f")]
        y_title = "mean gap (ms)"
    if tracks > 1:
        tooltip.insert(0, alt.Tooltip("track:N"))
    encoding = dict(
        x=alt.X("x_lo:Q", title="iteration", scale=alt.Scale(nice=False, zero=False), axis=iteration_axis(width_px)),
        x2="x_hi:Q",
        y=alt.Y("y_lo:Q", title=y_title),
        y2="y_hi:Q",
        color=alt.Color("phase:N", scale=phase_scale(phases), sort=phases, title="host phase"),
        tooltip=tooltip,
    )
    chart = alt.Chart(data, title=title).mark_rect().encode(**encoding)
    if tracks > 1:
        chart = chart.encode(row=alt.Row("track:N", title=None))
    return chart.properties(width=width_px, height=height_px)


def host_gap_distribution_chart(parts: TableLike, *, max_phases: int = 10, width_px: int = 760) -> alt.LayerChart:
    """Per host phase, the distribution over all gaps of its time in a gap (from host_gaps_parts).

    Always aggregated: one row per phase with min, quartiles, p90, p99, max and mean over every gap
    (a gap without the phase counts as 0, as in host_gaps_by_phase); phases beyond the `max_phases`
    largest are summed as `other phases`.
    """
    table = _lumped_parts(parts, max_phases)
    phases = sort_phases(table.column("phase").to_pylist()) if table.num_rows else []
    data = sql(f"""
        WITH gaps AS (SELECT DISTINCT global_tid, iteration FROM t),
             phases AS (SELECT DISTINCT phase FROM t),
             grid AS (SELECT f.phase, coalesce(x.dur_ns, 0) / {NS_PER_MS} AS ms
                      FROM gaps g CROSS JOIN phases f
                      LEFT JOIN t x ON x.global_tid = g.global_tid AND x.iteration = g.iteration AND x.phase = f.phase),
             total AS (SELECT sum(dur_ns) / {NS_PER_MS} AS ms FROM t)
        SELECT phase, count(*) AS gaps, count(*) FILTER (WHERE ms > 0) AS gaps_with_phase,
               min(ms) AS min_ms, quantile_cont(ms, 0.25) AS p25_ms, quantile_cont(ms, 0.5) AS p50_ms,
               quantile_cont(ms, 0.75) AS p75_ms, quantile_disc(ms, 0.9) AS p90_ms,
               quantile_disc(ms, 0.99) AS p99_ms, max(ms) AS max_ms, avg(ms) AS mean_ms,
               sum(ms) / nullif((SELECT ms FROM total), 0) AS share
        FROM grid GROUP BY phase""", t=table)
    y = alt.Y("phase:N", sort=phases, title=None)
    colour = alt.Color("phase:N", scale=phase_scale(phases or [UNATTRIBUTED]), legend=None)
    tooltip = [alt.Tooltip("phase:N"), alt.Tooltip("gaps_with_phase:Q", title="gaps with it", format=","),
               alt.Tooltip("share:Q", title="share of gap time", format=".1%")] + [
        alt.Tooltip(f"{q}_ms:Q", title=f"{q} (ms)", format=".3f") for q in ("mean", "p50", "p90", "p99", "max")]
    base = alt.Chart(data, title=alt.Title(
        "Time per gap in each host phase, over all gaps",
        subtitle="line: min to max; bar: middle half (p25 to p75); white tick: median; diamond: p99"))
    whisker = base.mark_rule(color="#888888").encode(x=alt.X("min_ms:Q", title="time in the gap (ms)"),
                                                     x2="max_ms:Q", y=y, tooltip=tooltip)
    box = base.mark_bar(height=14).encode(x="p25_ms:Q", x2="p75_ms:Q", y=y, color=colour, tooltip=tooltip)
    median = base.mark_tick(color="white", thickness=2, size=14).encode(x="p50_ms:Q", y=y, tooltip=tooltip)
    p99 = base.mark_point(shape="diamond", filled=True, color="black", size=40).encode(
        x="p99_ms:Q", y=y, tooltip=tooltip)
    return alt.layer(whisker, box, median, p99).properties(width=width_px, height=max(60, 26 * len(phases)))


def host_gap_chart(parts: TableLike, *, max_rows: int = 4000, max_phases: int = 10,
                   width_px: int = 760) -> alt.VConcatChart:
    """The gap per iteration stacked by host phase, above each phase's distribution over gaps (host_gaps_parts).

    Both parts reduce as host_gap_iterations_chart and host_gap_distribution_chart say: bins of
    iterations above `max_rows` rows, one row per phase for the distribution.
    """
    return alt.vconcat(
        host_gap_iterations_chart(parts, max_rows=max_rows, max_phases=max_phases, width_px=width_px),
        host_gap_distribution_chart(parts, max_phases=max_phases, width_px=width_px),
    ).resolve_scale(color="independent")


def iteration_timeline_chart(iterations: TableLike, *, origin_ns: int | None = None, max_iterations: int = 2000,
                             first_iteration: int | None = None, window_iterations: int = 25,
                             width_px: int = 760) -> alt.Chart:
    """Host (step range) and device intervals of each iteration on one time axis: a gap is white space.

    Drag to pan, scroll to zoom; the first view spans `window_iterations` iterations. At most
    `max_iterations` iterations are embedded: above that, the chart holds the window of that many
    iterations from `first_iteration` (default: the first), and its title says which of how many.
    Times count from `origin_ns`, the capture's start (capture_start_ns), else from the first step.
    """
    table = as_arrow(iterations, ITERATIONS_COLUMNS, what="iterations").select(list(ITERATIONS_COLUMNS))
    total = table.num_rows
    start = "(SELECT min(iteration) FROM t)" if first_iteration is None else str(int(first_iteration))
    first_ns, last_ns = sql("SELECT min(host_start_ns) AS lo, max(greatest(host_end_ns, device_end_ns)) AS hi FROM t",
                            t=table).to_pylist()[0].values()
    axis = time_axis(first_ns, last_ns, origin_ns, "the first step started")
    at, to, unit = axis.field("start"), axis.field("end"), axis.unit
    data = sql(f"""
        WITH kept AS (SELECT * FROM t WHERE iteration >= {start} ORDER BY iteration LIMIT {int(max_iterations)}),
             tracks AS (SELECT count(DISTINCT global_tid) AS n FROM kept),
             lanes AS (
               SELECT global_tid, iteration, 'host: step' AS lane, 0 AS lane_rank,
                      host_start_ns AS start_ns, host_end_ns AS end_ns FROM kept
               UNION ALL
               SELECT global_tid, iteration, 'device', 1, device_start_ns, device_end_ns FROM kept)
        SELECT CASE WHEN (SELECT n FROM tracks) > 1 THEN 'thread ' || global_tid::VARCHAR || ' ' ELSE '' END
                 || lane AS lane,
               iteration, {axis.sql('start_ns')} AS {at}, {axis.sql('end_ns')} AS {to},
               (end_ns - start_ns) / {NS_PER_MS} AS dur_ms
        FROM lanes WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL
        ORDER BY global_tid, lane_rank, start_ns""", t=table)
    shown = sorted(set(data.column("iteration").to_pylist()))
    title = "Iteration timeline: host step and device interval per iteration"
    subtitle = ["white space in the device lane is a host gap; drag to pan, scroll to zoom"]
    if len(shown) < total:
        subtitle.append(f"iterations {shown[0]} to {shown[-1]} of {total} shown" if shown else "no iterations shown")
    domain = None
    if shown:
        window = sql(f"""SELECT min({at}) AS lo, max({to}) AS hi FROM d
                         WHERE iteration < {shown[min(window_iterations, len(shown)) - 1] + 1}""", d=data)
        lo, hi = window.to_pylist()[0].values()
        margin = 0.01 * (hi - lo)
        domain = [lo - margin if lo < 0 or lo - margin >= 0 else 0.0, hi + margin]  # never before the capture
    lanes = sorted(set(data.column("lane").to_pylist()), key=lambda s: (not s.endswith("step"), s))
    zoom = alt.selection_interval(bind="scales", encodings=["x"])
    return alt.Chart(data, title=alt.Title(title, subtitle=subtitle)).mark_bar(
            clip=True, stroke="white", strokeWidth=0.5).encode(
        x=alt.X(f"{at}:Q", title=axis.title,
                scale=alt.Scale(domain=domain, zero=False, nice=False) if domain else alt.Scale(zero=False)),
        x2=f"{to}:Q",
        y=alt.Y("lane:N", sort=lanes, title=None, axis=alt.Axis(labelLimit=0)),  # 'thread <global tid> device' in full
        color=alt.Color("lane:N", sort=lanes, legend=None,
                        scale=alt.Scale(domain=lanes, range=["#9ecae9" if "host" in s else "#4c78a8" for s in lanes])),
        tooltip=[alt.Tooltip("iteration:Q"), alt.Tooltip("lane:N"),
                 alt.Tooltip(f"{at}:Q", title=f"start ({unit})", format=",.3f"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=",.3f")],
    ).add_params(zoom).properties(width=width_px, height=40 * max(2, len(lanes)))
