"""The steps of a capture as a strip of bands to set above a time chart: each iteration's host step and
device interval (`iterations`), numbered, alternately shaded so that neighbours stay apart."""
from __future__ import annotations

import altair as alt
import pyarrow as pa

from itertrace.dashboards.chart_data import TableLike, as_arrow, bin_width, iteration_span, sql
from itertrace.dashboards.time_axis import TimeAxis

STEP_COLUMNS = ("iteration", "host_start_ns", "host_end_ns", "device_start_ns", "device_end_ns")
LANES = ("host step", "device interval")
NUMBERS = "step"  # the lane above them that numbers the steps
_SHADES = {("host step", 0): "#c6dbef", ("host step", 1): "#9ecae1",
           ("device interval", 0): "#6baed6", ("device interval", 1): "#3182bd"}
LABELLED_STEPS = 40  # at most this many bands carry their step number as text


def step_bands(iterations: TableLike, axis: TimeAxis, max_steps: int = 500) -> pa.Table:
    """One row per band: a step's (or a bin of consecutive steps') host step and device interval on `axis`.

    Above `max_steps` steps, consecutive steps are binned (equal counts) and a band spans its bin.
    """
    table = as_arrow(iterations, STEP_COLUMNS, what="iterations").select(list(STEP_COLUMNS))
    table = sql("SELECT * FROM t WHERE iteration IS NOT NULL", t=table)
    width = bin_width(iteration_span(table), max_steps)
    start, end = axis.field("start"), axis.field("end")
    return sql(f"""
        WITH b AS (SELECT (iteration - (SELECT min(iteration) FROM t)) // {width} AS bin,
                          min(iteration) AS first_step, max(iteration) AS last_step,
                          min(host_start_ns) AS hs, max(host_end_ns) AS he,
                          min(device_start_ns) AS ds, max(device_end_ns) AS de
                   FROM t GROUP BY bin),
             lanes AS (SELECT *, '{LANES[0]}' AS lane, hs AS s, he AS e FROM b
                       UNION ALL SELECT *, '{LANES[1]}', ds, de FROM b)
        SELECT lane, first_step, last_step,
               CASE WHEN first_step = last_step THEN first_step::VARCHAR
                    ELSE first_step::VARCHAR || '–' || last_step::VARCHAR END AS step,
               lane || ' ' || (bin % 2)::VARCHAR AS shade,
               {axis.sql('s')} AS {start}, {axis.sql('e')} AS {end}, (e - s) / {axis.ns_per_unit} AS dur,
               {axis.sql('(least(hs, coalesce(ds, hs)) + greatest(he, coalesce(de, he))) / 2')} AS mid
        FROM lanes WHERE s IS NOT NULL AND e IS NOT NULL
        ORDER BY lane, s""", t=table)


def steps_strip(bands: pa.Table, axis: TimeAxis, domain: list[float], width_px: int) -> alt.LayerChart:
    """The bands of step_bands over `domain`, one lane each for host steps and device intervals, and above them
    each step's number where there are few; hover for a step's times."""
    start, end, unit = axis.field("start"), axis.field("end"), axis.unit
    shades = [f"{lane} {p}" for lane in LANES for p in (0, 1)]
    x = alt.X(f"{start}:Q", title=None, axis=None, scale=alt.Scale(domain=domain, nice=False, zero=False))
    binned = any(a != b for a, b in zip(bands.column("first_step").to_pylist(), bands.column("last_step").to_pylist()))
    tooltip = [alt.Tooltip("step:N", title="steps" if binned else "step"), alt.Tooltip("lane:N"),
               alt.Tooltip(f"{start}:Q", title=f"start ({unit})", format=",.3f"),
               alt.Tooltip("dur:Q", title=f"duration ({unit})", format=",.3f")]
    hosts = sum(1 for lane in bands.column("lane").to_pylist() if lane == LANES[0])
    labelled = 0 < hosts <= LABELLED_STEPS
    lanes = [NUMBERS, *LANES] if labelled else list(LANES)
    y = alt.Y("lane:N", sort=lanes, scale=alt.Scale(domain=lanes), title=None, axis=alt.Axis(labelLimit=0))
    base = alt.Chart(bands)
    layers = [base.mark_rect(clip=True).encode(
        x=x, x2=f"{end}:Q", y=y,
        color=alt.Color("shade:N", legend=None, scale=alt.Scale(domain=shades, range=[_SHADES[lane, p]
                                                                for lane in LANES for p in (0, 1)])),
        tooltip=tooltip)]
    if labelled:  # a number per step, centred over the step's host and device intervals
        label = "'step ' + datum.step" if hosts <= 3 else "datum.step"
        layers.append(base.transform_filter(alt.datum.lane == LANES[0]).transform_calculate(
            label=label, lane=f"'{NUMBERS}'").mark_text(fontSize=10, color="#08306b", clip=True).encode(
            x=alt.X("mid:Q", axis=None, scale=alt.Scale(domain=domain, nice=False, zero=False)),
            y=y, text="label:N", tooltip=[tooltip[0], *tooltip[2:]]))  # its lane is no lane of the step
    return alt.layer(*layers).properties(width=width_px, height=14 * len(lanes))
