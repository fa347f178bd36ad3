"""Charts of requests' latency and progress: TTFT and TPOT CDFs by class, and one request's progress, per run."""
from __future__ import annotations

import enum

import altair as alt

from itertrace.dashboards.chart_data import NS_PER_MS, TableLike, as_arrow, labels_in_order, sql

LATENCY_COLUMNS = ("request_id", "prompt_bucket", "prompt_bucket_lo", "priority", "tenant", "ttft_ns", "tpot_ns")
_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeWidth=3, symbolOpacity=1)
PROGRESS_COLUMNS = ("request_id", "tokens", "iteration", "since_arrival_ns", "others_working")


class ClassKind(enum.Enum):
    """How latency_cdf_chart splits requests into panels (latency_by_class_requests columns)."""

    PROMPT_BUCKET = "prompt_bucket"
    PRIORITY = "priority"
    TENANT = "tenant"
    ALL = "all"


_CLASS_SQL = {  # (class label, sort key)
    ClassKind.PROMPT_BUCKET: ("'prompt ' || prompt_bucket", "prompt_bucket_lo"),
    ClassKind.PRIORITY: ("'priority ' || priority::VARCHAR", "priority"),
    ClassKind.TENANT: ("'tenant ' || tenant", "0"),
    ClassKind.ALL: ("'all requests'", "0"),
}


def latency_cdf_chart(requests: TableLike, *, label: str = "run", by: ClassKind = ClassKind.PROMPT_BUCKET,
                      max_points: int = 300, log_x: bool = True, panel_width_px: int = 240,
                      columns: int = 3) -> alt.VConcatChart | alt.HConcatChart:
    """TTFT and TPOT CDFs, one curve per run, one panel per class (latency_by_class_requests plus a `label` column).

    With one class, TTFT and TPOT sit side by side; with several, each is a grid of panels.

    A curve with more than `max_points` requests (fewer when many curves share the chart, so that
    the chart stays under about 4,000 points) keeps every k-th request in latency order plus the
    first and last: exact quantiles at evenly spaced ranks.
    """
    table = as_arrow(requests, (label, *LATENCY_COLUMNS), what="latency_by_class_requests")
    table = table.select([label, *LATENCY_COLUMNS]).rename_columns(["run", *LATENCY_COLUMNS])
    runs = labels_in_order(table, "run")
    class_sql, order_sql = _CLASS_SQL[by]
    positive = "AND ns > 0" if log_x else ""
    values = sql(f"""
        SELECT run, {class_sql} AS class, {order_sql} AS class_order, 'TTFT' AS metric, ttft_ns AS ns, request_id
        FROM t WHERE ttft_ns IS NOT NULL
        UNION ALL
        SELECT run, {class_sql}, {order_sql}, 'TPOT', tpot_ns, request_id FROM t WHERE tpot_ns IS NOT NULL""", t=table)
    curves = len(sql("SELECT DISTINCT run, class, metric FROM v", v=values)) or 1
    per_curve = max(10, min(max_points, 4000 // curves))
    data = sql(f"""
        WITH r AS (SELECT *, row_number() OVER w AS k, count(*) OVER (PARTITION BY run, class, metric) AS n
                   FROM v WHERE TRUE {positive}
                   WINDOW w AS (PARTITION BY run, class, metric ORDER BY ns, request_id))
        SELECT run, class, class_order, metric, ns / {NS_PER_MS} AS ms, k / n AS fraction, k, n, request_id
        FROM r WHERE n <= {per_curve} OR k = 1 OR k = n OR k % ceil(n / {per_curve})::BIGINT = 0
        ORDER BY metric, class_order, class, run, k""", v=values)
    classes = [r["class"] for r in sql("SELECT DISTINCT class, class_order FROM d ORDER BY class_order, class",
                                       d=data).to_pylist()]
    colour = alt.Color("run:N", sort=runs, title=label, scale=alt.Scale(scheme="tableau10"), legend=_LEGEND)
    panels = []
    for metric, words in (("TTFT", "time to first token"), ("TPOT", "time per output token after the first")):
        chart = alt.Chart(data).transform_filter(f"datum.metric == '{metric}'").mark_line(
            interpolate="step-after", point=alt.OverlayMarkDef(size=12, opacity=0.6)).encode(
            x=alt.X("ms:Q", title=f"{metric} (ms)",
                    scale=alt.Scale(type="log", nice=False) if log_x else alt.Scale(zero=True),
                    axis=alt.Axis(tickCount=6, labelOverlap="greedy", format="~s" if log_x else ",")),
            y=alt.Y("fraction:Q", title="share of requests", axis=alt.Axis(format="%")),
            color=colour,
            tooltip=[alt.Tooltip("run:N", title=label), alt.Tooltip("class:N"),
                     alt.Tooltip("request_id:Q", title="request"),
                     alt.Tooltip("ms:Q", title=f"{metric} (ms)", format=",.3f"),
                     alt.Tooltip("fraction:Q", title="share at or below", format=".1%"),
                     alt.Tooltip("n:Q", title="requests in class")],
        ).properties(width=panel_width_px if len(classes) > 1 else 340, height=160)
        if len(classes) > 1:
            chart = chart.facet(facet=alt.Facet("class:N", sort=classes, title=None), columns=columns,
                                title=alt.Title(f"{metric}: {words}", subtitle="CDF per class, one curve per run"))
        else:
            chart = chart.properties(title=alt.Title(f"{metric}: {words}", subtitle=classes[0] if classes else ""))
        panels.append(chart)
    return alt.vconcat(*panels) if len(classes) > 1 else alt.hconcat(*panels)


def fairness_progress_chart(progress: TableLike, *, label: str = "run", max_points: int = 800,
                            width_px: int = 760) -> alt.VConcatChart:
    """A request's tokens against time since its arrival, one line per run (fairness_progress plus a `label` column).

    Below it, how many other requests ran in the iteration of each token. A run with more than
    `max_points` tokens keeps every k-th token plus the tokens on both sides of its longest stalls
    (up to a tenth of `max_points` waits, each over twice the median wait), so stalls stay flat steps.
    """
    table = as_arrow(progress, (label, *PROGRESS_COLUMNS), what="fairness_progress")
    table = table.select([label, *PROGRESS_COLUMNS]).rename_columns(["run", *PROGRESS_COLUMNS])
    runs = labels_in_order(table, "run")
    per_run = max(20, min(max_points, 4000 // max(1, len(runs))))
    data = sql(f"""
        WITH w AS (SELECT *, since_arrival_ns - lag(since_arrival_ns) OVER p AS wait_ns,
                          row_number() OVER p AS k, count(*) OVER (PARTITION BY run) AS n
                   FROM t WINDOW p AS (PARTITION BY run ORDER BY tokens)),
             typical AS (SELECT run, median(wait_ns) AS wait_ns FROM w GROUP BY run),
             flagged AS (SELECT w.*, row_number() OVER (PARTITION BY w.run ORDER BY w.wait_ns DESC NULLS LAST)
                                       <= {per_run // 10} AND w.wait_ns > 2 * y.wait_ns AS stall
                         FROM w JOIN typical y USING (run)),
             marked AS (SELECT *, lead(stall) OVER (PARTITION BY run ORDER BY tokens) AS before_stall FROM flagged)
        SELECT run, request_id, tokens, iteration, since_arrival_ns / {NS_PER_MS} AS since_arrival_ms,
               wait_ns / {NS_PER_MS} AS wait_ms, others_working
        FROM marked
        WHERE n <= {per_run} OR k = 1 OR k = n OR k % ceil(n / {per_run})::BIGINT = 0 OR stall OR before_stall
        ORDER BY run, tokens""", t=table)
    colour = alt.Color("run:N", sort=runs, title=label, scale=alt.Scale(scheme="tableau10"), legend=_LEGEND)
    x = alt.X("since_arrival_ms:Q", title="time since the request arrived (ms)")
    tip = [alt.Tooltip("run:N", title=label), alt.Tooltip("request_id:Q", title="request"),
           alt.Tooltip("tokens:Q"), alt.Tooltip("iteration:Q"),
           alt.Tooltip("since_arrival_ms:Q", title="since arrival (ms)", format=",.1f"),
           alt.Tooltip("wait_ms:Q", title="wait for this token (ms)", format=",.2f"),
           alt.Tooltip("others_working:Q", title="other requests in its iteration")]
    base = alt.Chart(data)
    progress_chart = alt.layer(
        base.mark_line(interpolate="step-after").encode(x=x, y=alt.Y("tokens:Q", title="tokens generated"),
                                                          color=colour, tooltip=tip),
        base.mark_point(size=15, opacity=0).encode(x=x, y="tokens:Q", color=colour, tooltip=tip),
        title=alt.Title("Progress of the followed request (by default the run's longest) among the others",
                        subtitle="a flat step is a stall: iterations in which it got no token"),
    ).properties(width=width_px, height=240)
    others = base.mark_line(interpolate="step-after", strokeWidth=1, opacity=0.8).encode(
        x=x, y=alt.Y("others_working:Q", title="others in its iteration"), color=colour, tooltip=tip,
    ).properties(width=width_px, height=90)
    return alt.vconcat(progress_chart, others)
