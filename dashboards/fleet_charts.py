"""Charts of a fleet: each rank's GPU time by share (fleet_ranks) and the skew between ranks by iteration (fleet_skew)."""
from __future__ import annotations

import altair as alt

from itertrace.dashboards.chart_data import NS_PER_MS, TableLike, as_arrow, bin_width, iteration_axis, sql
from itertrace.dashboards.gpu_charts import KIND_TITLES, TimeKind, kind_scale

RANK_COLUMNS = ("capture", "rank", "device_id", "busy_share", "idle_within_share", "idle_between_share",
                "idle_outside_share")
SKEW_COLUMNS = ("group", "world_size", "iteration", "skew_ns", "straggler_rank")


def rank_shares_chart(ranks: TableLike, *, max_ranks: int = 40, width_px: int = 640) -> alt.Chart:
    """One bar per rank and GPU (fleet_ranks), split into its window's busy and idle shares, least busy on top.

    Only the `max_ranks` least busy are drawn (the title says how many of how many)."""
    table = as_arrow(ranks, RANK_COLUMNS, what="fleet_ranks")
    shares = {TimeKind.BUSY: "busy_share", TimeKind.WITHIN: "idle_within_share",
              TimeKind.BETWEEN: "idle_between_share", TimeKind.OUTSIDE: "idle_outside_share"}
    data = sql(f"""
        WITH shown AS (
          SELECT capture || ' rank ' || coalesce(rank::VARCHAR, '?') || ' GPU ' || device_id::VARCHAR AS gpu, *,
                 row_number() OVER (ORDER BY busy_share, capture, rank, device_id) AS position
          FROM r WHERE device_id IS NOT NULL QUALIFY position <= {int(max_ranks)})
        SELECT gpu, position, kind, share, kind_rank FROM shown
        UNPIVOT (share FOR kind IN ({", ".join(f"{c} AS '{KIND_TITLES[k]}'" for k, c in shares.items())}))
        JOIN (VALUES {", ".join(f"('{KIND_TITLES[k]}', {i})" for i, k in enumerate(shares))}) AS o(kind, kind_rank)
          USING (kind)""", r=table.select(list(RANK_COLUMNS)))
    gpus = sql("SELECT count(*) AS n FROM r WHERE device_id IS NOT NULL", r=table.select(["device_id"]))
    total = gpus.column("n")[0].as_py()
    title = (f"Busy and idle share of each GPU's window ({total} GPUs)" if total <= max_ranks
             else f"Busy and idle share of the {max_ranks} least busy of {total} GPUs")
    return alt.Chart(data, title=title).mark_bar().encode(
        x=alt.X("share:Q", stack="zero", title="share of the capture window", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("gpu:N", sort=alt.EncodingSortField("position", order="ascending"), title=None),
        color=alt.Color("kind:N", scale=kind_scale(), title=None, legend=alt.Legend(orient="bottom")),
        order=alt.Order("kind_rank:Q"),
        tooltip=["gpu:N", "kind:N", alt.Tooltip("share:Q", format=".1%")],
    ).properties(width=width_px, height=alt.Step(14))


def skew_chart(skew: TableLike, *, max_groups: int = 8, max_points: int = 3000, width_px: int = 700,
               height_px: int = 120) -> alt.Chart:
    """Skew (slowest minus fastest rank's iteration time) by iteration number, a row per group (fleet_skew), each
    with its own iteration axis; the `max_groups` groups of largest skew.

    Where a group has more iterations than fit, consecutive iterations are binned and each bin shows its
    largest skew; a point marks each iteration with a straggler, coloured by that rank."""
    table = as_arrow(skew, SKEW_COLUMNS, what="fleet_skew").select(list(SKEW_COLUMNS))
    groups = sql(f"""
        SELECT "group", world_size FROM s GROUP BY ALL
        ORDER BY max(skew_ns) DESC, "group", world_size NULLS FIRST LIMIT {int(max_groups)}""", s=table)
    shown = max(1, groups.num_rows)
    span = sql("SELECT coalesce(max(iteration) - min(iteration) + 1, 0) AS n FROM s", s=table.select(["iteration"]))
    width = bin_width(span.column("n")[0].as_py() or 0, max(1, max_points // shown))
    data = sql(f"""
        SELECT s."group" || CASE WHEN s.world_size IS NULL THEN '' ELSE ' (world ' || s.world_size::VARCHAR || ')'
                 END AS group_label,
               (s.iteration // {width}) * {width} AS iteration, max(s.skew_ns) / {NS_PER_MS} AS skew_ms,
               CASE WHEN max(s.skew_ns) > 0 THEN 'rank ' || arg_max(s.straggler_rank, s.skew_ns)::VARCHAR END
                 AS straggler
        FROM s SEMI JOIN g ON g."group" = s."group" AND g.world_size IS NOT DISTINCT FROM s.world_size
        GROUP BY ALL ORDER BY group_label, iteration""", s=table, g=groups)
    binned = f", the largest of each {width} iterations" if width > 1 else ""
    total = sql('SELECT count(DISTINCT ("group", world_size)) AS n FROM s', s=table).column("n")[0].as_py()
    which = f"the {shown} groups of largest skew of {total}" if total > shown else "each group"
    base = alt.Chart().encode(
        x=alt.X("iteration:Q", title="iteration", axis=iteration_axis(width_px)),
        y=alt.Y("skew_ms:Q", title="skew (ms)"),
    )
    lines = base.mark_line(color="#bbbbbb")
    points = base.mark_point(filled=True, size=40).encode(
        color=alt.Color("straggler:N", title="straggler"),
        tooltip=["group_label:N", "iteration:Q", alt.Tooltip("skew_ms:Q", format=".3f"), "straggler:N"],
    ).transform_filter("datum.straggler != null")
    return alt.layer(lines, points, data=data).properties(width=width_px, height=height_px).facet(
        row=alt.Row("group_label:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
        title=f"Skew between the ranks of {which}, by iteration (slowest minus fastest rank{binned})",
    ).resolve_scale(x="independent", y="independent")
