"""Diff tests of queries/what_if_overlap.sql: iteration times, TPOT and throughput predicted with host phases hidden."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from query_fixtures import TID_A, TID_C, mark, pid_of, projection, push_pop, phase, step

from itertrace.errors import UserError
from itertrace.profiler.tracing.nvtx_ranges import PhaseName
from itertrace.cli import main
from itertrace.queries import QueryDB, set_params

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"  # the repository's real captures


def tokens(mark_id: int, iteration: int, ts_ns: int, text: str) -> dict:
    return mark(mark_id, text, ts_ns, iteration)


# Three CPU iterations (the device interval is the forward range). Step 2's schedule and prepare (60)
# take longer than step 1's forward (50). Requests 1 and 2 get a token in iterations 0 and 1, request 1
# also in iteration 2.
THREE_STEPS = {
    "nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "schedule", 0, 10, 1), phase(3, "prepare", 10, 20, 1), phase(4, "forward", 20, 70, 1),
        phase(5, "sample", 70, 80, 1), phase(6, "postprocess", 80, 95, 1),
        step(7, 1, 105, 200),  # 100..105 lies between the steps: host time of iteration 1, in no phase
        phase(8, "schedule", 105, 115, 7), phase(9, "prepare", 115, 125, 7), phase(10, "forward", 125, 175, 7),
        phase(11, "sample", 175, 185, 7), phase(12, "postprocess", 185, 195, 7),
        step(13, 2, 200, 300),
        phase(14, "schedule", 200, 230, 13), phase(15, "prepare", 230, 260, 13), phase(16, "forward", 260, 280, 13),
        phase(17, "sample", 280, 290, 13),
    ],
    "nvtx_marks": [tokens(1, 0, 90, "tokens +1,2"), tokens(2, 2, 295, "tokens -2")],
}

# what_if_overlap of THREE_STEPS hiding schedule and prepare (the default):
# (global_tid, iteration, first_in_run, iteration_ns, device_ns, host_ns, hidden_ns, hidden_next_ns,
#  exposed_ns, predicted_ns, end_ns, predicted_end_ns)
THREE_STEPS_DEFAULT = [
    # first on the track: its own 20 of schedule and prepare are exposed; iteration 1's 20 hide behind its forward
    (TID_A, 0, True, 100, 50, 50, 20, 20, 50, 100, 100, 100),
    # iteration 2's 60 hidden behind this forward of 50: max(50, 60) + (50 - 20)
    (TID_A, 1, False, 100, 50, 50, 20, 60, 30, 90, 200, 190),
    # the last: nothing behind it
    (TID_A, 2, False, 100, 20, 80, 60, 0, 20, 40, 300, 230),
]


def measured(rows: list[tuple]) -> list[tuple]:
    """What what_if_overlap gives with nothing hidden: the predicted columns equal the measured ones."""
    out = []
    for tid, it, first, iteration_ns, device_ns, host_ns, _, _, _, _, end_ns, _ in rows:
        out.append((tid, it, first, iteration_ns, device_ns, host_ns, 0, 0, host_ns, iteration_ns, end_ns, end_ns))
    return out


def test_no_ranges_no_rows(trace):
    trace.load()
    for view in ("what_if_overlap", "what_if_overlap_requests", "what_if_overlap_summary"):
        assert trace.query(view, {"hide": ""}) == [], view


def test_one_iteration_is_predicted_as_measured(trace):
    # Nothing runs before it to hide behind, and nothing after it to hide behind it.
    trace.load({"nvtx_ranges": THREE_STEPS["nvtx_ranges"][:6]})
    assert trace.query("what_if_overlap") == [(TID_A, 0, True, 100, 50, 50, 20, 0, 50, 100, 100, 100)]


def test_each_iterations_hidden_work_runs_behind_the_previous_device_interval(trace):
    trace.load(THREE_STEPS)
    assert trace.query("what_if_overlap") == THREE_STEPS_DEFAULT
    assert trace.query("what_if_overlap", {"hide": "schedule, prepare,schedule,"}) == THREE_STEPS_DEFAULT


def test_hiding_nothing_predicts_the_measured_times(trace):
    trace.load(THREE_STEPS)
    assert trace.query("what_if_overlap", {"hide": ""}) == measured(THREE_STEPS_DEFAULT)


def test_a_phase_not_in_hide_stays_exposed(trace):
    trace.load(THREE_STEPS)
    # Only schedule: hidden 10, 10, 30; prepare's 10, 10, 30 stay on the critical path.
    assert trace.query("what_if_overlap", {"hide": "schedule"}) == [
        (TID_A, 0, True, 100, 50, 50, 10, 10, 50, 100, 100, 100),
        (TID_A, 1, False, 100, 50, 50, 10, 30, 40, 90, 200, 190),
        (TID_A, 2, False, 100, 20, 80, 30, 0, 50, 70, 300, 260),
    ]


def test_phases_after_the_device_move_behind_the_previous_device_interval_too(trace):
    trace.load(THREE_STEPS)
    # sample and postprocess: 25, 20, 10 (step 2 has no postprocess).
    assert trace.query("what_if_overlap", {"hide": "sample,postprocess"}) == [
        (TID_A, 0, True, 100, 50, 50, 25, 20, 50, 100, 100, 100),
        (TID_A, 1, False, 100, 50, 50, 20, 10, 30, 80, 200, 180),
        (TID_A, 2, False, 100, 20, 80, 10, 0, 70, 90, 300, 270),
    ]


def test_a_hidden_phase_of_zero_length_hides_nothing(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "prepare", 10, 10, 1), phase(3, "forward", 20, 70, 1),
        step(4, 1, 100, 200),
        phase(5, "schedule", 100, 130, 4), phase(6, "prepare", 130, 130, 4), phase(7, "forward", 140, 190, 4),
    ]})
    rows = [(TID_A, 0, True, 100, 50, 50, 0, 0, 50, 100, 100, 100),
            (TID_A, 1, False, 100, 50, 50, 0, 0, 50, 100, 200, 200)]
    assert trace.query("what_if_overlap", {"hide": "prepare"}) == rows
    # schedule's 30 hides behind iteration 0's forward; the zero-length prepare adds nothing to it
    assert trace.query("what_if_overlap")[1] == (TID_A, 1, False, 100, 50, 50, 30, 0, 20, 70, 200, 170)


def test_an_idle_step_starts_a_new_run_at_its_measured_time(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "schedule", 0, 20, 1), phase(3, "forward", 20, 80, 1),
        step(4, 1, 100, 110),  # nothing runnable: no forward, so no device interval
        phase(5, "schedule", 100, 110, 4),
        step(6, 2, 300, 400),  # the engine waited for an arrival
        phase(7, "schedule", 300, 330, 6), phase(8, "forward", 330, 380, 6),
        step(9, 3, 400, 500),
        phase(10, "schedule", 400, 440, 9), phase(11, "forward", 440, 480, 9),
    ]})
    # Iteration 0 has nothing after it in its run; iteration 2 starts a run at its own step start, and
    # its own schedule is exposed; iteration 3's 40 hides behind iteration 2's forward of 50.
    assert trace.query("what_if_overlap", {"hide": "schedule"}) == [
        (TID_A, 0, True, 100, 60, 40, 20, 0, 40, 100, 100, 100),
        (TID_A, 2, True, 100, 50, 50, 30, 40, 50, 100, 400, 400),
        (TID_A, 3, False, 100, 40, 60, 40, 0, 20, 60, 500, 460),
    ]
    # (global_tid, iterations, runs, tokens, hidden_ns, wall_ns, predicted_wall_ns, speedup, ...): the
    # idle stretch 100..300 is kept, and the wall runs from step 0's start to step 3's end.
    assert trace.query("what_if_overlap_summary", {"hide": "schedule"})[0][:8] == (TID_A, 3, 2, 0, 90, 500, 460, 500 / 460)


def test_tpot_from_predicted_token_times(trace):
    trace.load(THREE_STEPS)
    # (global_tid, request_id, output_tokens, tpot_ns, predicted_tpot_ns): request 1's tokens at the
    # ends of iterations 0, 1, 2 (100, 200, 300; predicted 100, 190, 230), request 2's at 0 and 1.
    assert trace.query("what_if_overlap_requests") == [
        (TID_A, 1, 3, 100.0, 65.0),
        (TID_A, 2, 2, 100.0, 90.0),
    ]
    assert trace.query("what_if_overlap_requests", {"hide": ""}) == [
        (TID_A, 1, 3, 100.0, 100.0),
        (TID_A, 2, 2, 100.0, 100.0),
    ]


def test_summary_throughput_and_tpot(trace):
    trace.load(THREE_STEPS)
    # 5 tokens in 300 ns measured and 230 predicted; iteration times 100, 100, 100 against 100, 90, 40;
    # TPOT 100 and 100 against 65 and 90 (nearest rank: the 50th percentile of two is the first).
    assert trace.query("what_if_overlap_summary") == [
        (TID_A, 3, 1, 5, 100, 300, 230, 300 / 230, 5e9 / 300, 5e9 / 230, 100, 90, 100.0, 65.0, 100.0, 90.0)]
    assert trace.query("what_if_overlap_summary", {"hide": ""}) == [
        (TID_A, 3, 1, 5, 0, 300, 300, 1.0, 5e9 / 300, 5e9 / 300, 100, 100, 100.0, 100.0, 100.0, 100.0)]


def test_without_token_marks_the_summary_still_gives_the_speedup(trace):
    trace.load({"nvtx_ranges": THREE_STEPS["nvtx_ranges"]})
    assert trace.query("what_if_overlap_summary") == [
        (TID_A, 3, 1, 0, 100, 300, 230, 300 / 230, None, None, 100, 90, None, None, None, None)]


def test_each_track_is_modelled_apart(trace):
    shifted = [{**r, "global_tid": TID_C, "global_pid": pid_of(TID_C), "range_id": r["range_id"] + 100,
                "parent_range_id": None if r["parent_range_id"] is None else r["parent_range_id"] + 100}
               for r in THREE_STEPS["nvtx_ranges"][:12]]  # iterations 0 and 1 only, on a thread of another process
    trace.load({"nvtx_ranges": THREE_STEPS["nvtx_ranges"] + shifted})
    assert trace.query("what_if_overlap") == sorted(THREE_STEPS_DEFAULT + [
        (TID_C, 0, True, 100, 50, 50, 20, 20, 50, 100, 100, 100),
        (TID_C, 1, False, 100, 50, 50, 20, 0, 30, 80, 200, 180),
    ])


def test_on_a_gpu_only_hidden_time_outside_the_device_interval_counts(trace):
    # The device interval is the GPU work launched inside the step (30..120 and 150..170), which host
    # ranges overlap: only their time outside it is host time.
    trace.load({
        "nvtx_ranges": [
            step(1, 0, 0, 130),
            phase(2, "schedule", 0, 10, 1), phase(3, "forward", 10, 60, 1), phase(4, "sample", 60, 125, 1),
            step(5, 1, 130, 200),
            phase(6, "schedule", 130, 145, 5), phase(7, "forward", 145, 160, 5), phase(8, "sample", 160, 190, 5),
        ],
        "nvtx_gpu_projection": [projection(1, 30, 120, 1), projection(5, 150, 170, 1)],
    })
    # Period 0 is 0..130: device 90, host 40 (schedule 10, forward 10..30, sample 120..125, 125..130).
    # Period 1 is 130..200: device 20, host 50, of which schedule 15.
    assert trace.query("what_if_overlap", {"hide": "schedule"}) == [
        (TID_A, 0, True, 130, 90, 40, 10, 15, 40, 130, 130, 130),
        (TID_A, 1, False, 70, 20, 50, 15, 0, 35, 55, 200, 185),
    ]
    # forward's host range outside the GPU interval (10..30 and 145..150) is host time too
    assert [row[6] for row in trace.query("what_if_overlap", {"hide": "forward"})] == [20, 5]


def test_only_leaf_phases_count_as_in_host_gaps_parts(trace):
    # Step 1's prepare holds a library range (another domain): still a leaf, all 30 of it count.
    # Step 2's postprocess holds a schedule range: no leaf, so only schedule's 5 are a phase's time.
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100), phase(2, "forward", 20, 70, 1),
        step(3, 1, 100, 200),
        phase(4, "prepare", 100, 130, 3), push_pop(5, "aten::copy_", 120, 125, parent=4, depth=2, domain=None),
        phase(6, "forward", 130, 180, 3),
        step(7, 2, 200, 300),
        phase(8, "postprocess", 200, 230, 7), phase(9, "schedule", 210, 215, 8, depth=2),
        phase(10, "forward", 230, 280, 7),
    ]})
    hidden = lambda hide: [row[6] for row in trace.query("what_if_overlap", {"hide": hide})]  # noqa: E731
    assert (hidden("prepare"), hidden("postprocess"), hidden("schedule")) == ([0, 30, 0], [0, 0, 0], [0, 0, 5])


# Another engine's capture under the generic mapping: a range per iteration named `engine_step N`,
# phases named by their text (digits as #) or by the phase pattern's first capture group.
GENERIC = {
    "nvtx_ranges": [
        push_pop(1, "engine_step 0", 0, 100, domain=None),
        push_pop(2, "scheduler.schedule", 0, 15, parent=1, depth=1, domain=None),
        push_pop(3, "runner.prepare_inputs 0", 15, 30, parent=1, depth=1, domain=None),
        push_pop(4, "runner.process_outputs", 80, 95, parent=1, depth=1, domain=None),
        push_pop(5, "engine_step 1", 100, 200, domain=None),
        push_pop(6, "scheduler.schedule", 100, 110, parent=5, depth=1, domain=None),
        push_pop(7, "runner.prepare_inputs 1", 110, 140, parent=5, depth=1, domain=None),
        push_pop(8, "runner.process_outputs", 180, 190, parent=5, depth=1, domain=None),
    ],
    "nvtx_gpu_projection": [projection(1, 30, 80, 1), projection(5, 140, 180, 1)],
}
GENERIC_PARAMS = {"preset": "generic", "step_pattern": r"^engine_step \d+$"}


def test_other_engines_phases_by_the_mappings_names(trace):
    trace.load(GENERIC)
    rows = [(TID_A, 0, True, 100, 50, 50, 30, 40, 50, 100, 100, 100),
            (TID_A, 1, False, 100, 40, 60, 40, 0, 20, 60, 200, 160)]
    assert trace.query("what_if_overlap", {
        **GENERIC_PARAMS, "hide": "scheduler.schedule,runner.prepare_inputs #"}) == rows
    assert trace.query("what_if_overlap", {
        **GENERIC_PARAMS, "phase_pattern": r"^(?:scheduler|runner)\.(\w+)", "hide": "schedule,prepare_inputs"}) == rows


def test_an_unknown_phase_in_hide_is_refused_with_one_line(trace):
    trace.load(THREE_STEPS)
    with pytest.raises(UserError) as info:
        trace.query("what_if_overlap", {"hide": "schedule,sheduler"})
    assert str(info.value) == (
        "parameter hide: this trace has no host phase named 'sheduler' (its phases: forward, postprocess, "
        "prepare, sample, schedule); give the phases to hide as --param hide=NAME,NAME")
    with pytest.raises(UserError, match="no host phase named 'unattributed'"):  # the remainder is no phase
        trace.query("what_if_overlap_summary", {"hide": "unattributed"})


def test_the_default_on_another_engines_trace_says_what_its_phases_are(trace):
    trace.load(GENERIC)
    with pytest.raises(UserError) as info:
        trace.query("what_if_overlap", GENERIC_PARAMS)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("parameter hide: this trace has no host phase named '")  # schedule or prepare
    assert ("(its phases: engine_step #, runner.prepare_inputs #, runner.process_outputs, scheduler.schedule); "
            "hide is schedule,prepare when not given") in message


def test_the_default_hides_the_engines_phases_that_do_not_need_the_sampled_token(trace):
    ((default,),) = trace.sql("SELECT list_sort(_what_if_overlap_hide())")
    assert default == sorted([PhaseName.SCHEDULE.value, PhaseName.PREPARE.value])


def test_describe_gives_the_model_the_columns_and_the_hide_parameter(capsys):
    assert main(["query", "what_if_overlap", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "max(device_ns, hidden_next_ns) + exposed_ns" in out.splitlines()[0]
    assert "  hidden_next_ns    hidden_ns of the next iteration, run while this one's device works" in out
    assert "  hide: Host phases to hide behind the device" in out and "schedule,prepare when not given" in out


def test_an_unknown_phase_on_the_command_line_is_one_line_and_status_2(capsys, tmp_path):
    from query_fixtures import make_db
    db = make_db(tmp_path / "t.duckdb", THREE_STEPS)
    assert main(["query", "what_if_overlap_summary", "--db", str(db), "--param", "hide=prepare,sampel"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("itertrace: error: parameter hide: this trace has no host phase named 'sampel' "
                                 "(its phases: forward, postprocess, prepare, sample, schedule); give the phases "
                                 "to hide as --param hide=NAME,NAME\n")


# Random runs: steps with random phases (some holding another), a forward range as the device interval
# or none (an idle step), and time between the steps.
PHASE_NAMES = ("schedule", "prepare", "sample", "postprocess")


@st.composite
def random_run(draw) -> list[dict]:
    ranges: list[dict] = []
    start = 0
    for iteration in range(draw(st.integers(1, 6))):
        start += draw(st.sampled_from([0, 0, 7]))
        end = start + draw(st.integers(20, 100))
        step_id = len(ranges) + 1
        ranges.append(step(step_id, iteration, start, end))
        cuts = sorted(draw(st.sets(st.integers(start, end), min_size=2, max_size=10)))
        segments = list(zip(cuts[::2], cuts[1::2]))
        forward_at = draw(st.integers(-1, len(segments) - 1))  # -1: an idle step
        for k, (lo, hi) in enumerate(segments):
            outer_id = len(ranges) + 1
            name = "forward" if k == forward_at else draw(st.sampled_from(PHASE_NAMES))
            ranges.append(phase(outer_id, name, lo, hi, step_id))
            if hi > lo and draw(st.booleans()):
                inner_lo = draw(st.integers(lo, hi - 1))
                ranges.append(phase(len(ranges) + 1, draw(st.sampled_from(PHASE_NAMES)), inner_lo,
                                    draw(st.integers(inner_lo + 1, hi)), outer_id, depth=2))
        start = end
    return ranges


def model_by_counting(ranges: list[dict], hide: set[str]) -> list[tuple]:
    """what_if_overlap computed in Python, the hidden time instant by instant (the leaf holding each)."""
    steps = [r for r in ranges if r["text"] == "step"]
    phases = [r for r in ranges if r["text"] != "step"]
    parents = {r["parent_range_id"] for r in phases}
    leaves = [r for r in phases if r["range_id"] not in parents]
    rows, prev, run = [], None, []
    for s in steps:
        forwards = [r for r in phases if r["text"] == "forward" and s["start_ns"] <= r["start_ns"] < s["end_ns"]]
        if not forwards:
            prev, run = None, []
            continue
        period_start = s["start_ns"] if prev is None else prev["end_ns"]
        dev_lo = max(min(r["start_ns"] for r in forwards), period_start)
        dev_hi = min(max(r["end_ns"] for r in forwards), s["end_ns"])
        hidden = sum(1 for t in range(period_start, s["end_ns"]) if not dev_lo <= t < dev_hi
                     and any(r["text"] in hide and r["start_ns"] <= t < r["end_ns"] for r in leaves))
        row = {"iteration": s["int64_value"], "first": prev is None, "iteration_ns": s["end_ns"] - period_start,
               "device_ns": max(0, dev_hi - dev_lo), "hidden_ns": hidden, "end_ns": s["end_ns"],
               "run_start": s["start_ns"] if prev is None else run[0]["run_start"]}
        run.append(row)
        rows.append(row)
        if len(run) > 1:
            run[-2]["hidden_next_ns"] = hidden
        row["hidden_next_ns"] = 0
        prev = s
    out, elapsed = [], {}
    for row in rows:
        host = row["iteration_ns"] - row["device_ns"]
        exposed = host - (0 if row["first"] else row["hidden_ns"])
        predicted = max(row["device_ns"], row["hidden_next_ns"]) + exposed
        elapsed[row["run_start"]] = elapsed.get(row["run_start"], 0) + predicted
        out.append((TID_A, row["iteration"], row["first"], row["iteration_ns"], row["device_ns"], host,
                    row["hidden_ns"], row["hidden_next_ns"], exposed, predicted, row["end_ns"],
                    row["run_start"] + elapsed[row["run_start"]]))
    return sorted(out)


@settings(max_examples=25, deadline=None)
@given(ranges=random_run(), hide=st.sets(st.sampled_from(PHASE_NAMES), min_size=1))
def test_rows_match_a_model_counted_instant_by_instant(trace, ranges, hide):
    trace.load({"nvtx_ranges": ranges})
    present = {r["text"] for r in ranges} - {"step"}
    hide = hide & present
    assert trace.query("what_if_overlap", {"hide": ",".join(sorted(hide))}) == model_by_counting(ranges, hide)
    assert trace.query("what_if_overlap", {"hide": ""}) == model_by_counting(ranges, set())


# The committed captures (sample_traces/: CPU, torch runner, no overlap).

@pytest.mark.nsys
@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_on_the_samples_hiding_nothing_predicts_the_measured_iterations_and_throughput(sample_dbs, mode):
    summary = json.loads((SAMPLES / f"worked-example-{mode}" / "run" / "run.json").read_text())["summary"]
    with QueryDB(sample_dbs[mode], {"hide": ""}) as db:
        rows = db.query("what_if_overlap").to_pylist()
        (total,) = db.query("what_if_overlap_summary").to_pylist()
        # the iteration times straight from the step ranges: from one step's end to the next one's
        steps = db.sql("""SELECT iteration, host_end_ns - coalesce(lag(host_end_ns) OVER (ORDER BY host_start_ns),
                                                                 host_start_ns) AS ns, host_end_ns
                          FROM iterations ORDER BY host_start_ns""").to_pylist()
        (span,) = db.sql("SELECT max(host_end_ns) - min(host_start_ns) AS ns FROM iterations").to_pylist()
        tpot = db.sql("SELECT request_id, tpot_ns FROM request_latency_trace ORDER BY 1").to_pylist()
        requests = db.query("what_if_overlap_requests").to_pylist()
    assert len(rows) == summary["iterations"] and sum(r["first_in_run"] for r in rows) == 1
    assert [(r["iteration"], r["iteration_ns"], r["end_ns"]) for r in rows] == [
        (s["iteration"], s["ns"], s["host_end_ns"]) for s in steps]
    assert all(r["predicted_ns"] == r["iteration_ns"] and r["predicted_end_ns"] == r["end_ns"] for r in rows)
    assert total["tokens"] == summary["output_tokens"]
    assert total["wall_ns"] == total["predicted_wall_ns"] == span["ns"] and total["speedup"] == 1.0
    assert total["tokens_per_s"] == total["predicted_tokens_per_s"] == summary["output_tokens"] * 1e9 / span["ns"]
    # the engine's own figure, on its own clock: the same to within the clock reads around the NVTX calls
    assert total["tokens_per_s"] == pytest.approx(summary["throughput_tok_s"], rel=1e-3)
    assert [(r["request_id"], r["tpot_ns"], r["predicted_tpot_ns"]) for r in requests] == [
        (t["request_id"], t["tpot_ns"], t["tpot_ns"]) for t in tpot]


@pytest.mark.nsys
@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_on_the_samples_hidden_time_agrees_with_the_gap_attribution(sample_dbs, mode):
    """Two computations of the same phase time: what_if_overlap's per iteration, host_gaps_parts' per gap.

    Every gap lies between two iterations of one run; what lies outside all gaps is the first
    iteration's host time before its device work (schedule, prepare) and the last one's after it.
    """
    before, after = "schedule,prepare", "sample,detokenize,postprocess"
    with QueryDB(sample_dbs[mode]) as db:
        gaps = {r["phase"]: r["total_ns"] for r in db.query("host_gaps_by_phase").to_pylist()}
        set_params(db.con, {"hide": before})
        ahead = db.query("what_if_overlap").to_pylist()
        (total,) = db.query("what_if_overlap_summary").to_pylist()
        set_params(db.con, {"hide": after})
        behind = db.query("what_if_overlap").to_pylist()
    assert sum(r["hidden_ns"] for r in ahead[1:]) == gaps["schedule"] + gaps["prepare"]
    assert sum(r["hidden_ns"] for r in behind[:-1]) == gaps["sample"] + gaps["detokenize"] + gaps["postprocess"]
    # On the CPU, a forward pass (about 8 ms) is far longer than schedule and prepare (well under 1 ms):
    # all of every iteration's but the first one's hide behind the forward before it.
    assert all(r["hidden_next_ns"] < r["device_ns"] for r in ahead)
    assert total["wall_ns"] - total["predicted_wall_ns"] == sum(r["hidden_ns"] for r in ahead[1:])
    assert total["speedup"] > 1 and total["predicted_tpot_p50_ns"] < total["tpot_p50_ns"]
