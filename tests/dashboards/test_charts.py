"""Chart functions: their specs (marks, fields, encodings, tooltips) on small tables, and how they reduce large ones."""
from __future__ import annotations

import altair as alt
import pandas as pd
import pyarrow as pa
import pytest

from itertrace.dashboards import (
    ClassKind,
    active_tokens_chart,
    fairness_progress_chart,
    host_gap_chart,
    host_gap_distribution_chart,
    host_gap_iterations_chart,
    iteration_timeline_chart,
    label_runs,
    latency_cdf_chart,
    membership_chart,
    slot_time_chart,
)

MS = 1_000_000
BIG = 300_000  # iterations (or requests, or tokens) of a large input
SMALL_ENOUGH = 5_000  # rows a chart may embed


def units(spec: dict) -> list[dict]:
    """The unit specs (those with a mark) inside a spec, through layers, concatenations and facets."""
    if "mark" in spec:
        return [spec]
    found = []
    for key in ("layer", "vconcat", "hconcat", "concat"):
        for child in spec.get(key, []):
            found += units(child)
    if "spec" in spec:
        found += units(spec["spec"])
    return found


def mark(unit: dict) -> str:
    return unit["mark"] if isinstance(unit["mark"], str) else unit["mark"]["type"]


def tooltip_fields(unit: dict) -> set[str]:
    tip = unit["encoding"].get("tooltip", [])
    return {t["field"] for t in (tip if isinstance(tip, list) else [tip])}


def rows(spec: dict) -> list[dict]:
    """Every row the spec embeds, over all its datasets."""
    return [r for values in spec.get("datasets", {}).values() for r in values]


def dataset(spec: dict, unit: dict | None = None) -> list[dict]:
    """The rows of one dataset: the unit's, else the top level's, else the only one."""
    name = ((unit or {}).get("data") or spec.get("data") or {}).get("name")
    sets = spec["datasets"]
    return sets[name] if name else next(iter(sets.values()))


def gap_parts(gaps: dict[int, dict[str, int]], tid: int = 7) -> pa.Table:
    """host_gaps_parts rows: per gap (its iteration), ns per phase; unattributed included."""
    out = {"global_tid": [], "iteration": [], "phase": [], "dur_ns": []}
    for iteration, phases in gaps.items():
        for phase, ns in phases.items():
            out["global_tid"].append(tid)
            out["iteration"].append(iteration)
            out["phase"].append(phase)
            out["dur_ns"].append(ns)
    return pa.table(out)


# Host gaps ---------------------------------------------------------------------------------------

SMALL_GAPS = {1: {"schedule": 200_000, "prepare": 300_000, "unattributed": 100_000},
              2: {"schedule": 100_000, "sample": 50_000, "unattributed": 0},
              3: {"prepare": 400_000, "unattributed": 250_000}}


def test_gap_iterations_chart_stacks_each_gap_by_phase_with_unattributed_on_top():
    spec = host_gap_iterations_chart(gap_parts(SMALL_GAPS)).to_dict()
    (unit,) = units(spec)
    assert mark(unit) == "rect"
    enc = unit["encoding"]
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"], enc["y2"]["field"]) == (
        "x_lo", "x_hi", "y_lo", "y_hi")
    assert enc["color"]["field"] == "phase"
    domain, colours = enc["color"]["scale"]["domain"], enc["color"]["scale"]["range"]
    assert domain == ["sample", "schedule", "prepare", "unattributed"]  # in the order they fill a gap
    assert colours[-1] == "#3b3b3b"
    assert {"first_iteration", "phase", "mean_ms", "gap_mean_ms"} <= tooltip_fields(unit)
    data = dataset(spec)
    for iteration, phases in SMALL_GAPS.items():
        bars = sorted((r for r in data if r["first_iteration"] == iteration), key=lambda r: r["y_lo"])
        assert bars[0]["y_lo"] == 0
        assert all(a["y_hi"] == pytest.approx(b["y_lo"]) for a, b in zip(bars, bars[1:]))  # stacked, no overlap
        assert bars[-1]["y_hi"] == pytest.approx(sum(phases.values()) / MS)  # the parts add up to the gap
        assert bars[-1]["phase"] == "unattributed"


def test_gap_distribution_counts_a_gap_without_the_phase_as_zero():
    spec = host_gap_distribution_chart(gap_parts(SMALL_GAPS)).to_dict()
    marks = [mark(u) for u in units(spec)]
    assert marks == ["rule", "bar", "tick", "point"]
    bar = units(spec)[1]
    assert bar["encoding"]["y"]["field"] == "phase" and bar["encoding"]["x"]["field"] == "p25_ms"
    assert {"phase", "p50_ms", "p99_ms", "max_ms", "share"} <= tooltip_fields(bar)
    by_phase = {r["phase"]: r for r in dataset(spec)}
    assert by_phase["sample"]["gaps"] == 3 and by_phase["sample"]["gaps_with_phase"] == 1
    assert by_phase["sample"]["min_ms"] == 0 and by_phase["sample"]["max_ms"] == pytest.approx(0.05)
    assert by_phase["prepare"]["p50_ms"] == pytest.approx(0.3)
    assert sum(r["share"] for r in by_phase.values()) == pytest.approx(1)


def test_gap_chart_is_both_parts_and_accepts_pandas():
    chart = host_gap_chart(gap_parts(SMALL_GAPS).to_pandas())
    assert isinstance(chart, alt.VConcatChart)
    assert [mark(u) for u in units(chart.to_dict())] == ["rect", "rule", "bar", "tick", "point"]


def test_gap_charts_bin_a_large_run_and_keep_its_gap_time():
    n = BIG
    iteration = pa.array(range(1, n + 1), pa.int64())
    parts = pa.concat_tables([
        pa.table({"global_tid": pa.array([7] * n, pa.int64()), "iteration": iteration,
                  "phase": pa.array([phase] * n), "dur_ns": pa.array([ns] * n, pa.int64())})
        for phase, ns in (("schedule", 100_000), ("prepare", 200_000), ("unattributed", 50_000))])
    spec = host_gap_chart(parts).to_dict()
    assert len(rows(spec)) < SMALL_ENOUGH
    bars = dataset(spec, units(spec)[0])
    widths = {r["x_hi"] - r["x_lo"] for r in bars}
    assert len(widths) == 1 and widths.pop() > 1  # equal bins of several iterations
    total_ms = sum(r["mean_ms"] * r["gaps"] for r in bars)
    assert total_ms == pytest.approx(n * 0.35)
    assert "bins of" in str(units(spec)[0]["title"])


def test_gap_chart_lumps_phases_beyond_the_largest():
    gaps = {1: {f"p{i}": (i + 1) * 1000 for i in range(15)} | {"unattributed": 5}}
    spec = host_gap_iterations_chart(gap_parts(gaps), max_phases=4).to_dict()
    domain = units(spec)[0]["encoding"]["color"]["scale"]["domain"]
    assert domain == ["p11", "p12", "p13", "p14", "other phases", "unattributed"]


# Iteration timeline ------------------------------------------------------------------------------

def iterations_table(n: int, *, step_ns: int = 10 * MS, device_ns: int = 8 * MS, tid: int = 7) -> pa.Table:
    start = [i * step_ns for i in range(n)]
    return pa.table({
        "iteration": pa.array(range(n), pa.int64()), "global_tid": pa.array([tid] * n, pa.int64()),
        "host_start_ns": pa.array(start, pa.int64()), "host_end_ns": pa.array([s + step_ns for s in start], pa.int64()),
        "device_start_ns": pa.array([s + step_ns - device_ns for s in start], pa.int64()),
        "device_end_ns": pa.array([s + step_ns for s in start], pa.int64()),
    })


def test_timeline_draws_host_and_device_lanes_and_opens_on_the_first_iterations():
    spec = iteration_timeline_chart(iterations_table(100), window_iterations=10).to_dict()
    (unit,) = units(spec)
    assert mark(unit) == "bar"
    enc = unit["encoding"]
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"]) == ("start_ms", "end_ms", "lane")
    assert enc["y"]["sort"] == ["host: step", "device"]
    assert {"iteration", "lane", "start_ms", "dur_ms"} <= tooltip_fields(unit)
    lo, hi = enc["x"]["scale"]["domain"]
    assert lo < 0 + 2 and 95 < hi < 105  # ten 10 ms iterations, with a margin
    assert spec["params"][0]["bind"] == "scales"  # pan and zoom
    data = dataset(spec)
    assert len(data) == 200
    device = sorted((r for r in data if r["lane"] == "device"), key=lambda r: r["start_ms"])
    assert device[1]["start_ms"] - device[0]["end_ms"] == pytest.approx(2.0)  # the gap, left as white space


def test_timeline_lane_labels_of_several_threads_are_never_cut():
    """With two step threads a lane is named by its global tid and its kind ('thread 281477392629904 device'),
    longer than Vega-Lite's default 180 px label limit: cut, the host and device lanes looked alike."""
    tid = 281477392629904
    two = pa.concat_tables([iterations_table(4, tid=tid), iterations_table(4, tid=tid + 1)])
    (unit,) = units(iteration_timeline_chart(two).to_dict())
    assert unit["encoding"]["y"]["sort"] == [f"thread {tid} host: step", f"thread {tid + 1} host: step",
                                             f"thread {tid} device", f"thread {tid + 1} device"]
    assert unit["encoding"]["y"]["axis"]["labelLimit"] == 0  # no limit


def test_timeline_of_a_large_run_embeds_a_window():
    spec = iteration_timeline_chart(iterations_table(BIG), max_iterations=1000, first_iteration=5000).to_dict()
    data = rows(spec)
    assert len(data) == 2000
    assert min(r["iteration"] for r in data) == 5000 and max(r["iteration"] for r in data) == 5999
    assert f"of {BIG}" in " ".join(units(spec)[0]["title"]["subtitle"])


# Membership --------------------------------------------------------------------------------------

def membership_tables(members: dict[int, list[tuple[int, str]]], capacity: int) -> tuple[pa.Table, pa.Table]:
    """membership and membership_iterations rows from {iteration: [(request, state), ...] in list order}."""
    m = {"iteration": [], "request_id": [], "position": [], "state": []}
    its = {k: [] for k in ("iteration", "capacity", "working", "finished", "stalled", "empty", "active_tokens")}
    for iteration, held in members.items():
        for position, (request, state) in enumerate(held):
            for key, value in zip(m, (iteration, request, position, state)):
                m[key].append(value)
        counts = {s: sum(1 for _, st in held if st == s) for s in ("working", "finished", "stalled")}
        for key, value in (("iteration", iteration), ("capacity", capacity), ("empty", capacity - len(held)),
                           ("active_tokens", counts["working"]), *counts.items()):
            its[key].append(value)
    return pa.table(m), pa.table(its)


def static_batch() -> dict[int, list[tuple[int, str]]]:
    """Three requests; 1 and 2 finish after iteration 1 but keep their slots until 0 finishes after 5."""
    return {i: [(0, "working"), (1, "working" if i < 2 else "finished"), (2, "working" if i < 2 else "finished")]
            for i in range(6)}


def test_membership_colours_working_slots_by_request_and_finished_ones_apart():
    members, its = membership_tables(static_batch(), capacity=4)
    chart = membership_chart(members, its)
    spec = chart.to_dict()
    assert chart.usermeta["itertrace"]["binned"] is False
    marks = [mark(u) for u in units(spec)]
    assert marks == ["rect", "rect", "rect", "text"]  # empty slots, held slots, working slots, labels
    empty, held, working, labels = units(spec)
    assert working["encoding"]["color"]["field"] == "request"
    assert held["encoding"]["color"]["field"] == "state_title"
    assert "finished, slot still held" in held["encoding"]["color"]["scale"]["domain"]
    assert spec["resolve"]["scale"]["color"] == "independent"
    for unit in (held, working):
        assert (unit["encoding"]["x"]["field"], unit["encoding"]["x2"]["field"]) == ("lo", "hi")
        assert (unit["encoding"]["y"]["field"], unit["encoding"]["y2"]["field"]) == ("slot", "slot_hi")
        assert {"request", "state_title", "slot", "lo", "hi"} <= tooltip_fields(unit)
    runs = {(r["request_id"], r["state"]): (r["slot"], r["lo"], r["hi"]) for r in dataset(spec, held)}
    assert runs == {(0, "working"): (0, 0, 6), (1, "working"): (1, 0, 2), (1, "finished"): (1, 2, 6),
                    (2, "working"): (2, 0, 2), (2, "finished"): (2, 2, 6)}  # one rectangle per run
    capacity = dataset(spec, empty)
    assert capacity == [{"slot": 0, "slot_hi": 4, "state_title": "empty", "lo": 0, "hi": 6, "capacity": 4}]


def test_membership_keeps_a_request_in_its_slot_when_the_member_list_closes_up():
    members, its = membership_tables({0: [(0, "working"), (1, "working"), (2, "working")],
                                      1: [(1, "working"), (2, "working")],  # 0 left: positions shift
                                      2: [(1, "working"), (2, "working"), (3, "working")]}, capacity=3)
    spec = membership_chart(members, its).to_dict()
    slots = {r["request_id"]: r["slot"] for r in dataset(spec, units(spec)[2])}
    assert slots == {0: 0, 1: 1, 2: 2, 3: 0}  # the newcomer takes the freed slot 0
    spec = membership_chart(members, its, stable_slots=False).to_dict()
    by_position = {(r["request_id"], r["lo"]): r["slot"] for r in dataset(spec, units(spec)[2])}
    assert by_position[(1, 1)] == 0


def test_membership_of_a_large_run_is_binned_into_cells():
    n, slots = BIG, 4
    # Each slot's request changes every 10 iterations; slot 3 holds a finished request half the time.
    members = {"iteration": [], "request_id": [], "position": [], "state": []}
    iteration = pa.array(range(n), pa.int64())
    tables = []
    for slot in range(slots):
        request = pa.array([slot * n + i // 10 for i in range(n)], pa.int64())
        state = pa.array(["finished" if slot == 3 and (i // 10) % 2 else "working" for i in range(n)])
        tables.append(pa.table({"iteration": iteration, "request_id": request,
                                "position": pa.array([slot] * n, pa.int64()), "state": state}))
    members = pa.concat_tables(tables)
    its = pa.table({"iteration": iteration, "capacity": pa.array([slots] * n, pa.int64())})
    chart = membership_chart(members, its)
    spec = chart.to_dict()
    assert chart.usermeta["itertrace"]["binned"] is True
    (unit,) = units(spec)
    assert mark(unit) == "rect" and unit["encoding"]["color"]["field"] == "state_title"
    assert {"lo", "hi", "slot", "finished_share", "working_share", "empty_share"} <= tooltip_fields(unit)
    cells = rows(spec)
    assert len(cells) <= 4000
    for cell in cells:
        assert cell["working_share"] + cell["finished_share"] + cell["stalled_share"] + cell["empty_share"] == \
            pytest.approx(1)
    assert {c["state_title"] for c in cells if c["slot"] == 3} <= {"working", "finished, slot still held"}
    assert sum(c["finished"] for c in cells) == n // 2


# Active tokens -----------------------------------------------------------------------------------

def token_iterations(n: int, tokens) -> pa.Table:
    return pa.table({"iteration": pa.array(range(n), pa.int64()), "capacity": [8] * n, "working": [1] * n,
                     "finished": [0] * n, "stalled": [0] * n, "empty": [7] * n,
                     "active_tokens": pa.array([tokens(i) for i in range(n)], pa.int64())})


def test_active_tokens_of_two_runs_share_the_axes():
    table = label_runs({"static": token_iterations(50, lambda i: 8 if i < 10 else 1),
                        "continuous": token_iterations(40, lambda i: 8)})
    spec = active_tokens_chart(table).to_dict()
    line, points = units(spec)
    assert (mark(line), mark(points)) == ("line", "point")
    assert line["encoding"]["x"]["field"] == "iteration" and line["encoding"]["y"]["field"] == "active_tokens"
    assert line["encoding"]["color"]["field"] == "run"
    assert line["encoding"]["color"]["sort"] == ["static", "continuous"]
    assert line["encoding"]["y"]["scale"]["type"] == "symlog"
    assert {"run", "iteration", "active_tokens", "finished", "empty"} <= tooltip_fields(points)
    assert len(rows(spec)) == 90


def test_active_tokens_of_large_runs_are_binned_with_a_band():
    table = label_runs({"a": token_iterations(BIG, lambda i: 16 if i % 100 == 0 else 4),
                        "b": token_iterations(BIG // 2, lambda i: 2)})
    spec = active_tokens_chart(table, max_points=2000).to_dict()
    assert len(rows(spec)) <= 2000
    area, line, _ = units(spec)
    assert mark(area) == "area" and area["encoding"]["y2"]["field"] == "max_tokens"
    a = [r for r in rows(spec) if r["run"] == "a"]
    assert max(r["max_tokens"] for r in a) == 16 and min(r["min_tokens"] for r in a) == 4
    assert sum(r["active_tokens"] * r["iterations"] for r in a) == pytest.approx(4 * BIG + 12 * BIG // 100)


def test_active_tokens_of_many_runs_get_a_row_each():
    table = label_runs({k: token_iterations(20, lambda i: 3) for k in "abcd"})
    spec = active_tokens_chart(table).to_dict()
    assert spec["facet"]["row"]["field"] == "run"


# Latency CDFs ------------------------------------------------------------------------------------

def latency_requests(n: int, *, bucket=lambda i: 16, ttft=lambda i: (i + 1) * MS, tpot=lambda i: 5 * MS) -> pa.Table:
    lo = [bucket(i) for i in range(n)]
    return pa.table({"request_id": pa.array(range(n), pa.int64()),
                     "prompt_bucket": [f"[{b}, {2 * b})" for b in lo], "prompt_bucket_lo": pa.array(lo, pa.int64()),
                     "priority": pa.array([0] * n, pa.int64()), "tenant": ["default"] * n,
                     "ttft_ns": pa.array([ttft(i) for i in range(n)], pa.int64()),
                     "tpot_ns": pa.array([tpot(i) if i % 5 else None for i in range(n)], pa.float64())})


def test_latency_cdfs_of_one_class_sit_side_by_side():
    table = label_runs({"fcfs": latency_requests(10), "srw": latency_requests(10, ttft=lambda i: 2 * MS)})
    chart = latency_cdf_chart(table)
    assert isinstance(chart, alt.HConcatChart)
    spec = chart.to_dict()
    ttft, tpot = units(spec)
    for unit in (ttft, tpot):
        assert mark(unit) == "line"
        assert (unit["encoding"]["x"]["field"], unit["encoding"]["y"]["field"]) == ("ms", "fraction")
        assert unit["encoding"]["x"]["scale"]["type"] == "log"
        assert unit["encoding"]["color"]["field"] == "run"
        assert {"run", "class", "request_id", "ms", "fraction"} <= tooltip_fields(unit)
    data = rows(spec)
    fcfs_ttft = sorted((r for r in data if r["run"] == "fcfs" and r["metric"] == "TTFT"), key=lambda r: r["k"])
    assert [r["ms"] for r in fcfs_ttft] == [float(i + 1) for i in range(10)]
    assert fcfs_ttft[-1]["fraction"] == 1
    assert len([r for r in data if r["run"] == "fcfs" and r["metric"] == "TPOT"]) == 8  # NULL TPOTs left out


def test_latency_cdfs_of_several_classes_are_panels():
    table = label_runs({"fcfs": latency_requests(40, bucket=lambda i: 16 if i < 20 else 512)})
    spec = latency_cdf_chart(table).to_dict()
    assert [p["facet"]["field"] for p in spec["vconcat"]] == ["class", "class"]
    assert spec["vconcat"][0]["facet"]["sort"] == ["prompt [16, 32)", "prompt [512, 1024)"]
    spec = latency_cdf_chart(table, by=ClassKind.TENANT).to_dict()
    assert "hconcat" in spec  # one tenant: one panel per metric


def test_latency_cdfs_of_many_requests_keep_evenly_spaced_ranks():
    table = label_runs({"a": latency_requests(BIG, ttft=lambda i: (BIG - i) * 1000)})
    spec = latency_cdf_chart(table, max_points=300).to_dict()
    data = rows(spec)
    assert len(data) < 700
    ttft = sorted((r for r in data if r["metric"] == "TTFT"), key=lambda r: r["k"])
    assert ttft[0]["k"] == 1 and ttft[-1]["k"] == BIG and ttft[-1]["fraction"] == 1
    assert ttft[-1]["ms"] == pytest.approx(BIG / 1000)


# Fairness ----------------------------------------------------------------------------------------

def progress_table(n: int, stall_at: int | None = None, stall_ns: int = 0) -> pa.Table:
    since = [i * 10 * MS + (stall_ns if stall_at is not None and i >= stall_at else 0) for i in range(n)]
    return pa.table({"request_id": pa.array([7] * n, pa.int64()), "tokens": pa.array(range(1, n + 1), pa.int64()),
                     "iteration": pa.array(range(n), pa.int64()), "since_arrival_ns": pa.array(since, pa.int64()),
                     "others_working": pa.array([3] * n, pa.int64())})


def test_fairness_progress_draws_tokens_over_time_per_run():
    table = label_runs({"fcfs": progress_table(30), "srw": progress_table(30, stall_at=10, stall_ns=500 * MS)})
    spec = fairness_progress_chart(table).to_dict()
    line, points, others = units(spec)
    assert (mark(line), mark(points), mark(others)) == ("line", "point", "line")
    assert (line["encoding"]["x"]["field"], line["encoding"]["y"]["field"]) == ("since_arrival_ms", "tokens")
    assert others["encoding"]["y"]["field"] == "others_working"
    assert {"run", "request_id", "tokens", "iteration", "wait_ms"} <= tooltip_fields(points)
    srw = {r["tokens"]: r for r in rows(spec) if r["run"] == "srw"}
    assert srw[11]["wait_ms"] == pytest.approx(510)


def test_fairness_progress_of_a_long_request_keeps_its_stall():
    table = label_runs({"a": progress_table(BIG, stall_at=123_457, stall_ns=900 * MS)})
    spec = fairness_progress_chart(table, max_points=800).to_dict()
    data = rows(spec)
    assert len(data) < 1000
    tokens = {r["tokens"] for r in data}
    assert {1, 123_457, 123_458, BIG} <= tokens  # first, both sides of the stall, last


# Slot-time ---------------------------------------------------------------------------------------

def slot_time_rows() -> pa.Table:
    def row(mode, iterations, working, finished, empty):
        slots = iterations * 16
        return {"mode": mode, "policy": "fcfs", "simulated": True, "iterations": iterations, "slot_iterations": slots,
                "working": working, "finished": finished, "stalled": 0, "empty": empty,
                "idle": slots - working, "idle_share": (slots - working) / slots}
    return pa.Table.from_pylist([
        {"workload": "uniform", **row("static", 100, 1600, 0, 0)},
        {"workload": "uniform", **row("continuous", 100, 1600, 0, 0)},
        {"workload": "variable", **row("static", 600, 1600, 8000, 0)},
        {"workload": "variable", **row("continuous", 102, 1600, 0, 32)},
    ])


def test_slot_time_compares_both_workloads_and_both_modes():
    spec = slot_time_chart(slot_time_rows()).to_dict()
    assert spec["facet"]["row"]["field"] == "workload"
    bars, text = units(spec)
    assert (mark(bars), mark(text)) == ("bar", "text")
    assert (bars["encoding"]["x"]["field"], bars["encoding"]["x2"]["field"], bars["encoding"]["y"]["field"]) == (
        "x_lo", "x_hi", "mode")
    assert bars["encoding"]["color"]["scale"]["domain"] == [
        "working", "finished, slot still held", "stalled (live, ran nothing)", "empty"]
    assert {"workload", "mode", "kind_title", "value", "share"} <= tooltip_fields(bars)
    data = rows(spec)
    assert len(data) == 16
    stranded = next(r for r in data if r["workload"] == "variable" and r["mode"] == "static"
                    and r["kind_title"].startswith("finished"))
    assert stranded["value"] == 8000 and stranded["x_hi"] == 9600
    assert text["encoding"]["text"]["field"] == "note"


# Inputs ------------------------------------------------------------------------------------------

def test_a_table_without_a_needed_column_is_a_value_error():
    with pytest.raises(ValueError, match="host_gaps_parts lacks column dur_ns"):
        host_gap_chart(pa.table({"global_tid": [1], "iteration": [1], "phase": ["x"]}))


def test_label_runs_takes_pairs_with_repeated_labels_and_pandas():
    table = label_runs([("uniform", pd.DataFrame({"x": [1]})), ("uniform", pa.table({"x": [2]}))], "workload")
    assert table.column_names == ["workload", "x"]
    assert table.to_pylist() == [{"workload": "uniform", "x": 1}, {"workload": "uniform", "x": 2}]


def test_every_chart_takes_an_empty_table():
    def empty(**types) -> pa.Table:
        return pa.table({name: pa.array([], kind) for name, kind in types.items()})

    i64, text = pa.int64(), pa.string()
    charts = [
        host_gap_chart(empty(global_tid=i64, iteration=i64, phase=text, dur_ns=i64)),
        iteration_timeline_chart(empty(iteration=i64, global_tid=i64, host_start_ns=i64, host_end_ns=i64,
                                       device_start_ns=i64, device_end_ns=i64)),
        membership_chart(empty(iteration=i64, request_id=i64, position=i64, state=text),
                         empty(iteration=i64, capacity=i64)),
        active_tokens_chart(empty(run=text, iteration=i64, capacity=i64, working=i64, finished=i64, stalled=i64,
                                  empty=i64, active_tokens=i64)),
        latency_cdf_chart(empty(run=text, request_id=i64, prompt_bucket=text, prompt_bucket_lo=i64, priority=i64,
                                tenant=text, ttft_ns=i64, tpot_ns=i64)),
        fairness_progress_chart(empty(run=text, request_id=i64, tokens=i64, iteration=i64, since_arrival_ns=i64,
                                      others_working=i64)),
        slot_time_chart(empty(workload=text, mode=text, iterations=i64, slot_iterations=i64, working=i64,
                              finished=i64, stalled=i64, empty=i64, idle_share=pa.float64())),
    ]
    for chart in charts:
        assert rows(chart.to_dict()) == []


def test_phase_names_are_data_not_sql():
    spec = host_gap_iterations_chart(gap_parts({1: {"it's; DROP": 5_000, "unattributed": 1_000}})).to_dict()
    assert {r["phase"] for r in rows(spec)} == {"it's; DROP", "unattributed"}
