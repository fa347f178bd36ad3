"""`itertrace experiment overlap` on the simulated runner, where the cost model makes its figures exact, its bad
input, the log-side what-if against the query's, and the report's section of the two timelines."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from query_fixtures import TID_A, TraceDB, create_statements, insert, make_db, mark, push_pop

from itertrace.cli import main
from live_run import ITERTRACE, MEDIAN_BOUND_NS, RUN, needs_nsys
from itertrace.dashboards import build_report
from itertrace.experiments.overlap import HIDDEN, SIM_HOST_NS, likely_cause, split
from itertrace.experiments.overlap_figures import from_capture, from_run_dir

TOKENS = 7 * 32 + 512 + 8 * 32  # the worked example's 16 requests
ITERATIONS = 512  # the long request's 512 tokens, one a decode iteration, the others beside it


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[dict, Path]:
    """Two rounds on the simulated runner, as JSON, and the folder of their run logs."""
    out = tmp_path_factory.mktemp("overlap") / "runs"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["experiment", "overlap", "--repeat", "2", "--format", "json", "--out", str(out)]) == 0
    return json.loads(text.getvalue()), out


def forward_ns(run_dir: Path) -> int:
    """The run's forward passes' total time, from its iteration log."""
    t = pq.read_table(run_dir / "iterations.parquet", columns=["device_start_ns", "device_end_ns"]).to_pylist()
    return sum(r["device_end_ns"] - r["device_start_ns"] for r in t)


def test_the_cost_model_makes_the_figures_exact(simulated):
    """Without overlap an iteration takes host + device time; with it the larger, here always the device's
    (the forward pass's fixed 8 ms is over the 4 ms host time), so only the first iteration's host time shows."""
    result, out = simulated
    device = forward_ns(out / "overlap-off-0" / "run")
    assert device == forward_ns(out / "overlap-on-0" / "run")  # the same batches
    host = SIM_HOST_NS
    off_wall, on_wall = ITERATIONS * host + device, host + device
    for run in result["runs"]:
        assert run["output_tokens"] == TOKENS and run["tokens_dropped"] == 0
        if run["overlap"]:
            assert run["wall_s"] == pytest.approx(on_wall / 1e9, rel=1e-12)
            assert run["throughput_tok_s"] == pytest.approx(TOKENS / on_wall * 1e9, rel=1e-12)
            assert (run["gap_share"], run["gap_p50_us"], run["gap_p99_us"]) == (0, 0, 0)
        else:
            assert run["throughput_tok_s"] == pytest.approx(TOKENS / off_wall * 1e9, rel=1e-12)
            # a gap before every forward pass but the first: the next iteration's host time
            assert run["gap_share"] == pytest.approx((ITERATIONS - 1) * host / off_wall, rel=1e-12)
            assert (run["gap_p50_us"], run["gap_p99_us"]) == (host / 1e3, host / 1e3)
            assert run["predicted"]["wall_s"] == pytest.approx(on_wall / 1e9, rel=1e-12)
    for r in result["rounds"]:
        assert r["tokens_identical"] and r["requests_differing"] == []
        assert r["throughput_gain"] == pytest.approx(off_wall / on_wall, rel=1e-12)
        assert r["prediction_error"] == pytest.approx(0, abs=1e-12)
    assert [(r["round"], r["overlap"]) for r in result["runs"]] == [(0, False), (0, True), (1, True), (1, False)]


def test_the_split_on_the_simulated_runner_is_the_cost_models(simulated):
    """Overlap hides the host time of every iteration but the first (the cost model's 4 ms each) and leaves the
    forward passes as they were: the split says so, to the nanosecond, and its parts add up to the wall change."""
    result, out = simulated
    device_ms = forward_ns(out / "overlap-off-0" / "run") / ITERATIONS / 1e6
    for r in result["rounds"]:
        assert r["host_hidden_ms_per_iteration"] == pytest.approx((ITERATIONS - 1) * SIM_HOST_NS / ITERATIONS / 1e6,
                                                                  rel=1e-9)
        assert r["device_change_ms_per_iteration"] == 0 and r["device_growth"] == 0
        assert r["forward_ms_off"] == r["forward_ms_on"] == pytest.approx(device_ms, rel=1e-12)
        assert r["wall_change_ms_per_iteration"] == pytest.approx(
            r["device_change_ms_per_iteration"] - r["host_hidden_ms_per_iteration"], rel=1e-9)
    assert result["likely_cause"] is None


def run_figures(wall_ms: float, device_ms: float, forward_passes: int = 4) -> dict:
    return {"wall_s": wall_ms / 1e3, "device_s": device_ms / 1e3, "forward_passes": forward_passes}


def test_the_split_when_the_device_slows_down():
    """By hand: without overlap 4 passes of 2 ms and 4 ms of exposed host time (12 ms); with it 4 passes of 3 ms and
    1 ms exposed (13 ms): 3 ms of host time hidden, 4 ms more on the device, 1 ms more wall time, per iteration a quarter."""
    s = split(run_figures(12, 8), run_figures(13, 12))
    assert s == pytest.approx({"wall_change_ms_per_iteration": 0.25, "host_hidden_ms_per_iteration": 0.75,
                               "device_change_ms_per_iteration": 1.0, "forward_ms_off": 2.0, "forward_ms_on": 3.0,
                               "device_growth": 0.5}, rel=1e-12)


def test_the_likely_cause_names_the_shared_cores_on_the_cpu():
    from itertrace.cli import build_parser
    from itertrace.profiler.cli import spec_from_args

    torch_cpu = spec_from_args(build_parser().parse_args(["run", "--runner", "torch", "--device", "cpu"]))
    machine = {"cores": 2, "load_1m_before": 1.0, "load_1m_after": 1.5}
    cause = likely_cause(torch_cpu, 0.43, "nsys capture", machine)
    assert cause.startswith("the forward passes took 43% longer with overlap: on the CPU the device is a thread")
    assert "shares the 2 cores with the host thread and the profiler" in cause and "load 1.0 before, 1.5 after" in cause
    assert "the profiler" not in likely_cause(torch_cpu, 0.43, "run logs", machine)
    assert likely_cause(torch_cpu, 0.04, "run logs", machine) is None


def test_json_keys(simulated):
    result, _ = simulated
    assert set(result) == {"experiment", "runner", "simulated", "workload", "capacity", "repeat", "source",
                           "host_ns_per_iteration", "hide", "hide_note", "gap_share_definition", "runs", "rounds",
                           "median", "what_if_assumes", "machine", "likely_cause"}
    assert (result["experiment"], result["source"], result["simulated"], result["capacity"], result["repeat"]) == (
        "overlap", "run logs", True, 8, 2)
    assert result["hide"] == "schedule,prepare,detokenize,postprocess"
    figures = {"wall_s", "device_s", "forward_passes", "output_tokens", "gap_share", "gap_p50_us", "gap_p99_us", "throughput_tok_s",
               "tpot_ms_p50", "tpot_ms_p99", "tokens_dropped", "tokens"}
    for run in result["runs"]:
        assert set(run) == {"round", "overlap", "name", "db", *figures} | (set() if run["overlap"] else {"predicted"})
    assert set(result["rounds"][0]) == {
        "round", "tokens_identical", "requests_differing", "tokens_dropped", "gap_share_ratio", "throughput_gain",
        "predicted_throughput_gain", "throughput_tok_s", "predicted_throughput_tok_s", "prediction_error", "predicted_tpot_ms_p50",
        "predicted_tpot_ms_p99", "wall_change_ms_per_iteration", "host_hidden_ms_per_iteration",
        "device_change_ms_per_iteration", "forward_ms_off", "forward_ms_on", "device_growth"}
    assert set(result["median"]) >= {"off", "on", "throughput_gain", "prediction_error", "tokens_identical"}


def test_table_says_source_hidden_phases_and_cost_model(capsys):
    assert main(["experiment", "overlap"]) == 0
    text = capsys.readouterr().out
    assert "figures from the run logs" in text and "hide=schedule,prepare,detokenize,postprocess" in text
    assert "SIMULATED" in text and "host time 4 ms per iteration" in text
    assert "median host-gap share with overlap / without: x0.000" in text
    assert "it assumes each forward pass takes as long as in the run without overlap" in text
    assert "so wall change = device change - host hidden" in text and "likely cause" not in text


@pytest.mark.parametrize("argv, says", [
    (["--overlap"], "experiment overlap sets --overlap itself"),
    (["--requests", "40"], "experiment overlap sets --requests itself"),
    (["--cost", "{cost}"], "host_ns is 0"),
])
def test_bad_input_is_one_line(argv, says, tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"cost_model": {"fixed_ns": 1e6, "per_token_ns": 1e3, "per_context_token_ns": 1.0,
                                               "source": "calibrated here"}}))
    out = tmp_path / "out"
    assert main(["experiment", "overlap", *[a.format(cost=cost) for a in argv], "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_repeat_is_refused_elsewhere_and_below_one(capsys):
    assert main(["experiment", "fairness", "--repeat", "2"]) != 0
    assert capsys.readouterr().err.strip() == "itertrace: error: --repeat: only experiment overlap reads it"
    assert main(["experiment", "overlap", "--repeat", "0"]) != 0
    err = capsys.readouterr().err.strip()
    assert err == "itertrace: error: experiment: argument --repeat: expected an integer of at least 1, not 0"


# Steps as (iteration, start, end, forward pass or None, schedule, prepare): schedule from the step's start,
# prepare after it, then the forward pass, end to end as the engine runs them without overlap. The third
# step waits for an arrival: no forward pass.
STEPS = [(0, 0, 100, (20, 70), 10, 10), (1, 105, 200, (125, 175), 10, 10), (2, 200, 210, None, 5, 0),
         (3, 215, 300, (260, 280), 30, 15), (4, 300, 390, (320, 370), 10, 10)]


def as_log(steps) -> list[dict]:
    """The run log of `steps`: phases end to end from the step's start, as the engine times them."""
    rows = []
    for it, a, b, dev, sch, prep in steps:
        forward = dev[1] - dev[0] if dev else 0
        rows.append({"iteration": it, "start_ns": a, "end_ns": b, "dur_ns": b - a, "schedule_ns": sch,
                     "prepare_ns": prep, "forward_ns": forward, "sample_ns": b - a - sch - prep - forward,
                     "detokenize_ns": 0, "postprocess_ns": 0, "num_seqs": 1 if dev else 0,
                     "device_start_ns": dev and dev[0], "device_end_ns": dev and dev[1]})
    return rows


def log_db(path: Path, iterations: list[dict]) -> Path:
    """A database of a run directory alone (the run tables, no capture) holding `iterations`."""
    con = duckdb.connect(str(path))
    for statement in create_statements():
        if statement.split()[2].startswith("run_"):
            con.execute(statement)
    insert(con, {"run_iterations": iterations, "run_meta": [{"config_json": json.dumps({"overlap": False})}]})
    con.close()
    return path


def as_trace(steps) -> list[dict]:
    ranges = []
    for it, a, b, dev, sch, prep in steps:
        base = 10 * it + 1
        ranges.append(push_pop(base, "step", a, b, payload=it))
        ranges.append(push_pop(base + 1, "schedule", a, a + sch, parent=base, depth=1))
        if prep:
            ranges.append(push_pop(base + 2, "prepare", a + sch, a + sch + prep, parent=base, depth=1))
        if dev:
            ranges.append(push_pop(base + 3, "forward", *dev, parent=base, depth=1))
    return ranges


@pytest.mark.parametrize("hide", ["schedule,prepare", "prepare", ""])
def test_a_run_log_alone_gives_the_traces_gaps_and_prediction(hide, tmp_path):
    """host_gaps and what_if_overlap over a run log alone (the capture it stands for) against a trace of the same
    steps: the same gaps and predicted ends, through a step without a forward pass (a new run of iterations
    starts after it)."""
    from itertrace.queries import QueryDB

    query = "SELECT iteration, predicted_end_ns FROM what_if_overlap"
    with TraceDB() as trace:
        trace.load({"nvtx_ranges": as_trace(STEPS)})
        traced = {row[0]: row[1] for row in trace.sql(query, {"hide": hide})}
        traced_gaps = trace.sql("SELECT iteration, gap_ns FROM host_gaps")
    with QueryDB(log_db(tmp_path / "log.duckdb", as_log(STEPS)), params={"hide": hide}) as q:
        logged = {row[0]: row[1] for row in q.rows(query)}
        logged_gaps = sorted(q.rows("SELECT iteration, gap_ns FROM host_gaps"))
    assert logged == traced and set(logged) == {0, 1, 3, 4}
    assert logged_gaps == sorted(traced_gaps) == [(1, 55), (3, 85), (4, 40)]
    if hide == "schedule,prepare":
        # by hand: 0 exposes its 50 of host time, 1's 20 hide behind its forward (50): 100; 1 has nothing
        # behind it (3 starts a run): 50 + 30 exposed; 3 starts at 215, all 65 of host time exposed, 4's 20
        # behind its 20 of forward: 85; 4: 50 + 20 exposed
        assert logged == {0: 100, 1: 180, 3: 300, 4: 370}


def traced_run(path: Path, overlap: bool, period: int) -> Path:
    """A capture of three CPU iterations (steps with phases and forward ranges) and a run_meta saying --overlap."""
    ranges, rid = [], 1
    for it, t in enumerate((0, period, 2 * period)):
        step = rid
        ranges.append(push_pop(step, "step", t, t + 90, payload=it))
        for name, a, b in (("schedule", 0, 10), ("prepare", 10, 20), ("forward", 20, 70), ("sample", 70, 80)):
            rid += 1
            ranges.append(push_pop(rid, name, t + a, t + b, parent=step, depth=1))
        rid += 1
    meta = {"format": "itertrace-run/1", "runner": "torch", "simulated": False, "iterations": 3, "requests": 1,
            "config_json": json.dumps({"overlap": overlap})}
    return make_db(path, {"nvtx_ranges": ranges, "nvtx_marks": [mark(1, "tokens +1", 85, 0, tid=TID_A)],
                          "run_meta": [meta]})


def test_the_report_shows_both_timelines_one_above_the_other(tmp_path):
    off, on = traced_run(tmp_path / "off.duckdb", False, 100), traced_run(tmp_path / "on.duckdb", True, 90)
    report = build_report([off, on], ["without", "with"])
    section = next(s for s in report.sections if s.id == "overlap")
    (block,) = section.blocks
    spec = block.chart.to_dict()
    assert [c["title"] for c in spec["vconcat"]] == ["without overlap", "with overlap"]
    assert "iterations 0 to 2" in spec["title"]["text"]
    values = [v for d in spec["datasets"].values() for v in d]
    # per run: 3 device intervals, and 3 host leaves per step (schedule, prepare, sample; forward is the device's)
    assert sorted((v["lane"], v["phase"]) for v in values).count(("device", "device interval")) == 6
    assert sum(v["lane"] == "host" for v in values) == 18
    alone = build_report([off], ["without"])
    assert "overlap" not in [s.id for s in alone.sections]


def within_nvtx_overhead(traced: list[int], logged: list[int]) -> bool:
    """The median difference within the NVTX overhead (test_profile_live.py's MEDIAN_BOUND_NS). Not each one:
    on a loaded machine the OS now and then stops a thread between the clock read and the NVTX call, for
    milliseconds (2 gaps in 15 seen here), while a wrong join or clock would put most of them off."""
    diffs = sorted(abs(a - b) for a, b in zip(traced, logged, strict=True))
    return diffs[len(diffs) // 2] < MEDIAN_BOUND_NS


@pytest.mark.nsys
@needs_nsys
@pytest.mark.parametrize("overlap", [False, True])
def test_the_capture_and_the_run_log_agree(overlap, tmp_path):
    """A profiled torch run: its capture, through the queries, and its run log give the same outputs, and each
    gap and each predicted iteration time within the NVTX overhead."""
    from itertrace.ingest.profile import profile_command
    from itertrace.queries import QueryDB

    done = profile_command([ITERTRACE, *RUN, *(["--overlap"] if overlap else [])], tmp_path / "prof",
                           echo=io.StringIO())
    hide = None if overlap else HIDDEN
    traced, logged = from_capture(done.db, done.run_dir, hide), from_run_dir(done.run_dir, hide)
    assert traced["output_tokens"] == logged["output_tokens"] > 0 and traced["tokens"] == logged["tokens"]
    assert traced["forward_passes"] == logged["forward_passes"] > 0
    # the totals (wall_s, device_s) add up per-iteration times, in which an OS stall of a loaded machine lands
    # on one side only; each iteration's host and device time is compared instead, as the gaps are
    steps = "SELECT iteration, host_dur_ns, device_dur_ns FROM iterations WHERE device_start_ns IS NOT NULL"
    with QueryDB(done.db, params={"hide": ",".join(HIDDEN)}) as q:
        gaps = dict(q.rows("SELECT iteration, gap_ns FROM host_gaps"))
        ends = dict(q.rows("SELECT iteration, predicted_end_ns FROM what_if_overlap"))
        traced_steps = sorted(q.rows(steps))
    with QueryDB(done.run_dir.with_name("run.duckdb"), params={"hide": ",".join(HIDDEN)}) as q:  # from_run_dir's
        logged_gaps = dict(q.rows("SELECT iteration, gap_ns FROM host_gaps"))
        logged_ends = dict(q.rows("SELECT iteration, predicted_end_ns FROM what_if_overlap")) if not overlap else {}
        logged_steps = sorted(q.rows(steps))
    assert [s[0] for s in traced_steps] == [s[0] for s in logged_steps]
    for column in (1, 2):
        assert within_nvtx_overhead([s[column] for s in traced_steps], [s[column] for s in logged_steps]), column
    assert sorted(gaps) == sorted(logged_gaps)
    assert within_nvtx_overhead([gaps[i] for i in sorted(gaps)], [logged_gaps[i] for i in sorted(gaps)])
    if not overlap:
        its = sorted(logged_ends)
        assert sorted(ends) == its
        steps = lambda e: [e[b] - e[a] for a, b in zip(its, its[1:])]  # noqa: E731  clocks differ: durations
        assert within_nvtx_overhead(steps(ends), steps(logged_ends))
