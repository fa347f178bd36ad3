"""session.run_in_turn: several runs in one process, an iteration each in turn, each as if it had run alone."""
from __future__ import annotations

from dataclasses import replace

import pyarrow.parquet as pq

from itertrace.profiler import clock as clock_module
from itertrace.profiler.clock import WallClock
from itertrace.profiler.scheduling.scheduler import Mode
from itertrace.profiler.session import RunSpec, run, run_in_turn, summarize
from itertrace.profiler.workloads import build_requests
from itertrace.profiler.workloads import slot_time as slot_time_specs

TABLES = ("iterations", "events", "requests")


def _jobs(tmp_path, name):
    jobs = []
    for kind, n in (("variable", 40), ("uniform", 20)):
        for mode in (Mode.STATIC, Mode.CONTINUOUS):
            spec = RunSpec(scheduler=replace(RunSpec().scheduler, mode=mode, max_num_seqs=8))
            reqs = build_requests(slot_time_specs(kind, n, 16, 3), seed=3)
            jobs.append((spec, reqs, tmp_path / name / f"{kind}-{mode.value}", kind))
    return jobs


def test_runs_in_turn_log_exactly_what_they_log_alone(tmp_path):
    """On the simulated runner the clock is virtual, so taking turns must change nothing at all."""
    alone = [run(spec, reqs, run_dir=d, workload=w) for spec, reqs, d, w in _jobs(tmp_path, "alone")]
    in_turn = run_in_turn(_jobs(tmp_path, "in-turn"))
    for a, b in zip(alone, in_turn):
        assert summarize(a, 8) == summarize(b, 8)
    for spec, _, d, _ in _jobs(tmp_path, "alone"):
        other = tmp_path / "in-turn" / d.name
        for table in TABLES:
            assert pq.read_table(d / f"{table}.parquet").equals(pq.read_table(other / f"{table}.parquet")), (d, table)
    # the runs differ in length, so some finished while others went on
    assert len({r.iterations for r in in_turn}) > 1


def test_a_paused_wall_clock_does_not_count_the_pause(monkeypatch):
    now = [1_000]
    monkeypatch.setattr(clock_module.time, "perf_counter_ns", lambda: now[0])
    c = WallClock()
    now[0] += 50
    assert c.now_ns() == 50
    c.pause()
    now[0] += 1_000_000  # another engine's turn
    c.resume()
    assert c.now_ns() == 50
    now[0] += 7
    assert c.now_ns() == 57
    c.resume()  # resuming a running clock changes nothing
    assert c.now_ns() == 57
