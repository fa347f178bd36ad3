"""The membership chart: who held each slot of the batch, iteration by iteration (membership, membership_iterations)."""
from __future__ import annotations

import heapq

import altair as alt
import pyarrow as pa

from itertrace.dashboards.chart_data import TableLike, as_arrow, bin_width, iteration_axis, iteration_span, sql

# What a slot did in an iteration, darkest for the waste: a slot held by a finished request.
STATES = ("working", "finished", "stalled", "empty")
STATE_COLOURS = {"working": "#4c78a8", "finished": "#474747", "stalled": "#a3a3a3", "empty": "#e6e6e6"}
STATE_TITLES = {"working": "working", "finished": "finished, slot still held", "stalled": "stalled (live, ran nothing)",
                "empty": "empty"}
# One colour per request: Tableau 20 without its greys, which mean finished, stalled and empty here.
REQUEST_COLOURS = ("#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d", "#f1ce63",
                   "#499894", "#86bcb6", "#e15759", "#ff9d9a", "#d37295", "#fabfd2", "#b07aa1", "#d4a6c8",
                   "#9d7660", "#d7b5a6")

MEMBERSHIP_COLUMNS = ("iteration", "request_id", "position", "state")


def state_scale(states: tuple[str, ...]) -> alt.Scale:
    """The colours of these slot states, under their titles."""
    return alt.Scale(domain=[STATE_TITLES[s] for s in states], range=[STATE_COLOURS[s] for s in states])


def _stable_slots(stretches: list[dict]) -> list[int]:
    """A slot per stretch of consecutive membership: a request keeps its slot; a newcomer takes the lowest free one.

    Stretches come sorted by first iteration, then by place in the member list; interval
    partitioning by earliest start never needs more slots than the most members at once.
    """
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (last iteration, slot)
    next_slot = 0
    slots = []
    for s in stretches:
        while busy and busy[0][0] < s["first"]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            slot = heapq.heappop(free)
        else:
            slot, next_slot = next_slot, next_slot + 1
        heapq.heappush(busy, (s["last"], slot))
        slots.append(slot)
    return slots


def _slotted_membership(membership: pa.Table, stable_slots: bool) -> pa.Table:
    """membership with a `slot` column: a stable slot per stretch, or the member-list position."""
    if not stable_slots:
        return sql("SELECT iteration, request_id, state, position AS slot FROM m", m=membership)
    keyed = sql("""SELECT iteration, request_id, position, state,
                          iteration - row_number() OVER (PARTITION BY request_id ORDER BY iteration) AS stretch
                   FROM m""", m=membership)
    stretches = sql("""SELECT request_id, stretch, min(iteration) AS first, max(iteration) AS last,
                              arg_min(position, iteration) AS position
                       FROM k GROUP BY request_id, stretch ORDER BY first, position, request_id""", k=keyed)
    rows = stretches.select(["first", "last"]).to_pylist()
    stretches = stretches.append_column("slot", pa.array(_stable_slots(rows), pa.int64()))
    return sql("""SELECT k.iteration, k.request_id, k.state, s.slot
                  FROM k JOIN s USING (request_id, stretch)""", k=keyed, s=stretches)


def membership_chart(membership: TableLike, membership_iterations: TableLike, *, stable_slots: bool = True,
                     max_rects: int = 4000, width_px: int = 760) -> alt.LayerChart:
    """Iteration by slot, coloured by request; finished requests' held slots dark grey, empty slots light.

    From membership and membership_iterations. With `stable_slots` a request keeps the slot it
    entered and a newcomer takes the lowest free one (the view's `position` is the order of the
    member list, which closes up when a member leaves); otherwise the slot is that position. Runs of
    iterations in which a slot keeps its request and state are drawn as one rectangle (lossless).
    When there are more than `max_rects` such runs, or so many that they average under 4 pixels
    wide, iterations (and, above 64 slots, slots) are binned into at most `max_rects` cells and
    each cell takes the colour of the state that held most of its slot-iterations (no request
    colours), with every state's share in the tooltip. The chart's usermeta says which:
    `{"itertrace": {"binned": bool, "iterations_per_cell": int}}`.
    """
    members = as_arrow(membership, MEMBERSHIP_COLUMNS, what="membership").select(list(MEMBERSHIP_COLUMNS))
    its = as_arrow(membership_iterations, ("iteration", "capacity"), what="membership_iterations")
    its = its.select(["iteration", "capacity"])
    slotted = _slotted_membership(members, stable_slots)
    runs = sql("""
        WITH r AS (SELECT *, iteration - row_number() OVER (PARTITION BY slot, request_id, state ORDER BY iteration)
                               AS k
                   FROM s)
        SELECT slot, request_id, state, min(iteration) AS lo, max(iteration) + 1 AS hi FROM r
        GROUP BY slot, request_id, state, k ORDER BY slot, lo""", s=slotted)
    capacity_row = sql("SELECT max(capacity) AS c, min(iteration) AS lo, max(iteration) + 1 AS hi FROM i", i=its)
    cap = capacity_row.to_pylist()[0]
    slots = max(int(cap["c"] or 0), int(sql("SELECT max(slot) + 1 AS n FROM r", r=runs).to_pylist()[0]["n"] or 0))
    if runs.num_rows > max_rects or runs.num_rows > slots * width_px / 4:
        return _binned_membership(slotted, its, slots, max_rects, width_px)
    span = max(1, int((cap["hi"] or 1) - (cap["lo"] or 0)))
    px_per_iteration = width_px / span
    data = sql(f"""
        SELECT slot, slot + 1 AS slot_hi, request_id, 'r' || request_id::VARCHAR AS request, state,
               CASE state WHEN 'working' THEN 'working' WHEN 'finished' THEN 'finished, slot still held'
                          ELSE 'stalled (live, ran nothing)' END AS state_title,
               lo, hi, hi - lo AS iterations,
               CASE WHEN (hi - lo) * {px_per_iteration} >= 8 * (length(request_id::VARCHAR) + 2)
                    THEN 'r' || request_id::VARCHAR END AS label
        FROM r ORDER BY slot, lo""", r=runs)
    background = sql("""
        WITH c AS (SELECT *, iteration - row_number() OVER (PARTITION BY capacity ORDER BY iteration) AS k FROM i)
        SELECT 0 AS slot, capacity AS slot_hi, 'empty' AS state_title, min(iteration) AS lo, max(iteration) + 1 AS hi,
               capacity
        FROM c GROUP BY capacity, k""", i=its)
    requests = len(set(data.column("request_id").to_pylist()))
    y = alt.Y("slot:Q", title="slot", scale=alt.Scale(domain=[0, slots], reverse=True, nice=False),
              axis=_slot_axis(slots))
    x = alt.X("lo:Q", title="iteration", scale=alt.Scale(domain=[cap["lo"] or 0, cap["hi"] or 1], nice=False),
              axis=iteration_axis(width_px))
    tip = [alt.Tooltip("request:N", title="request"), alt.Tooltip("state_title:N", title="state"),
           alt.Tooltip("slot:Q"), alt.Tooltip("lo:Q", title="from iteration"),
           alt.Tooltip("hi:Q", title="until iteration (excl.)"), alt.Tooltip("iterations:Q")]
    shown = ("finished", "stalled", "empty") if "stalled" in data.column("state").to_pylist() else ("finished", "empty")
    state_colour = alt.Color("state_title:N", title="slot", scale=state_scale(shown))
    empty = alt.Chart(background).mark_rect().encode(
        x=x, x2="hi:Q", y=y, y2="slot_hi:Q", color=state_colour,
        tooltip=[alt.Tooltip("capacity:Q", title="capacity (slots)"), alt.Tooltip("lo:Q", title="from iteration"),
                 alt.Tooltip("hi:Q", title="until iteration (excl.)")])
    base = alt.Chart(data)
    held = base.transform_filter("datum.state != 'working'").mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=x, x2="hi:Q", y=y, y2="slot_hi:Q", color=state_colour, tooltip=tip)
    legend = alt.Legend(title="request", columns=2, symbolLimit=20) if requests <= 20 else None
    working = base.transform_filter("datum.state == 'working'").mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=x, x2="hi:Q", y=y, y2="slot_hi:Q",
        color=alt.Color("request:N", scale=alt.Scale(range=list(REQUEST_COLOURS)), legend=legend,
                        sort=alt.EncodingSortField("request_id")),
        tooltip=tip)
    labels = base.transform_filter("datum.label != null").mark_text(
        align="left", baseline="middle", dx=3, dy=_slot_height(slots) / max(1, slots) / 2, fontSize=10,
        clip=True).encode(
        x=x, y=y, text="label:N",
        color=alt.condition("datum.state == 'working'", alt.value("black"), alt.value("white")), tooltip=tip)
    colours = "coloured: working, one colour per request" + ("" if requests <= 18 else " (colours repeat)")
    title = alt.Title("Batch membership: who held each slot, iteration by iteration",
                      subtitle=f"{colours}; dark grey: a finished request still holding its slot; light grey: empty")
    chart = alt.layer(alt.layer(empty, held), working, labels, title=title).resolve_scale(color="independent")
    return chart.properties(
        width=width_px, height=_slot_height(slots), usermeta={"itertrace": {"binned": False, "iterations_per_cell": 1}})


def _slot_axis(slots: int) -> alt.Axis:
    if slots <= 32:
        return alt.Axis(values=[s + 0.5 for s in range(slots)], labelExpr="floor(datum.value)", grid=False,
                        ticks=False, labelOverlap=False, labelFlush=False)
    return alt.Axis(format="d", grid=False)


def _slot_height(slots: int) -> int:
    return int(min(420, max(120, 22 * slots)))


def _binned_membership(slotted: pa.Table, its: pa.Table, slots: int, max_cells: int, width_px: int) -> alt.Chart:
    """Membership in cells of iterations x slots, each coloured by the state that held most of it."""
    slot_width = max(1, -(-slots // 64))
    rows = -(-slots // slot_width)
    width = bin_width(iteration_span(its), max(1, max_cells // rows))
    data = sql(f"""
        WITH first AS (SELECT min(iteration) AS it FROM i),
             bins AS (SELECT (iteration - (SELECT it FROM first)) // {width} AS bin, count(*) AS iterations,
                             min(iteration) AS lo, max(iteration) + 1 AS hi
                      FROM i GROUP BY bin),
             groups AS (SELECT unnest(range(0, {slots}, {slot_width})) AS slot),
             held AS (SELECT (iteration - (SELECT it FROM first)) // {width} AS bin,
                             slot // {slot_width} * {slot_width} AS slot,
                             count(*) FILTER (WHERE state = 'working') AS working,
                             count(*) FILTER (WHERE state = 'finished') AS finished,
                             count(*) FILTER (WHERE state = 'stalled') AS stalled
                      FROM s GROUP BY ALL),
             cells AS (
               SELECT b.lo, b.hi, g.slot, least(g.slot + {slot_width}, {slots}) AS slot_hi,
                      b.iterations * (least(g.slot + {slot_width}, {slots}) - g.slot) AS total,
                      coalesce(h.working, 0) AS working, coalesce(h.finished, 0) AS finished,
                      coalesce(h.stalled, 0) AS stalled
               FROM bins b CROSS JOIN groups g LEFT JOIN held h ON h.bin = b.bin AND h.slot = g.slot)
        SELECT *, greatest(total - working - finished - stalled, 0) AS empty,
               working / total AS working_share, finished / total AS finished_share,
               stalled / total AS stalled_share,
               greatest(total - working - finished - stalled, 0) / total AS empty_share,
               CASE greatest(working, finished, stalled, total - working - finished - stalled)
                 WHEN finished THEN 'finished, slot still held' WHEN working THEN 'working'
                 WHEN stalled THEN 'stalled (live, ran nothing)' ELSE 'empty' END AS state_title
        FROM cells ORDER BY slot, lo""", i=its, s=slotted)
    slot_note = f", {slot_width} slots per row" if slot_width > 1 else ""
    title = alt.Title("Batch membership by slot: the state that held most of each cell",
                      subtitle=f"{width} iterations per cell{slot_note}; too many requests to colour each one")
    return alt.Chart(data, title=title).mark_rect(strokeWidth=0.6).encode(
        x=alt.X("lo:Q", title="iteration", scale=alt.Scale(nice=False, zero=False), axis=iteration_axis(width_px)),
        x2="hi:Q",
        y=alt.Y("slot:Q", title="slot", scale=alt.Scale(domain=[0, slots], reverse=True, nice=False),
                axis=_slot_axis(slots) if slot_width == 1 else alt.Axis(format="d", grid=False)),
        y2="slot_hi:Q",
        color=alt.Color("state_title:N", title="most of the cell", scale=state_scale(STATES)),
        stroke=alt.Stroke("state_title:N", scale=state_scale(STATES)),
        tooltip=[alt.Tooltip("lo:Q", title="from iteration"), alt.Tooltip("hi:Q", title="until iteration (excl.)"),
                 alt.Tooltip("slot:Q", title="slot")] + [
            alt.Tooltip(f"{s}_share:Q", title=STATE_TITLES[s], format=".0%") for s in STATES],
    ).properties(width=width_px, height=_slot_height(rows),
                 usermeta={"itertrace": {"binned": True, "iterations_per_cell": width}})
