"""`itertrace profile`: a live torch run of the engine under nsys, ingested, checked against its own run log.

The acceptance check of issue 3. Trace rows and log rows are joined on iteration numbers (the step
range's payload) and request ids (the marks' payloads), never on clocks. A phase's duration in the log
brackets its NVTX range: the engine reads its clock just before the range opens and just after it
closes, so the two differ by the cost of the NVTX calls under nsys (tens of microseconds here) plus
any time the OS takes the CPU away in between.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from live_run import BOUND_NS, ITERTRACE, MEDIAN_BOUND_NS, RUN, needs_nsys

from itertrace.cli import main
from itertrace.ingest.nsys import machine_traces
from itertrace.ingest.profile import run_target
from itertrace.profiler.tracing.nvtx_ranges import PHASES


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Path, str]:
    """A profile of a short torch run: (the profile folder, what `itertrace profile` printed)."""
    out = tmp_path_factory.mktemp("profile") / "prof"
    # One torch thread: no spinning OpenMP worker competes with the engine thread for the 2 cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "itertrace.cli", "profile", "--out", str(out), "--",
                           ITERTRACE, *RUN], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    return out, done.stdout


@pytest.fixture(scope="module")
def con(profiled):
    out, _ = profiled
    with duckdb.connect(str(out / "trace.duckdb"), read_only=True) as connection:
        yield connection


def one(con, sql: str):
    return con.execute(sql).fetchone()


@pytest.mark.nsys
@needs_nsys
def test_profile_makes_report_run_and_database(profiled):
    out, printed = profiled
    assert sorted(p.name for p in out.iterdir()) == ["profile.log", "report.nsys-rep", "run", "trace.duckdb"]
    assert sorted(p.name for p in (out / "run").iterdir()) == [
        "events.parquet", "iterations.parquet", "requests.parquet", "run.json"]
    # nsys runs the command with umask 0; profile gives the run's files the usual modes back.
    assert not any(p.stat().st_mode & 0o002 for p in (out / "run", *(out / "run").iterdir()))
    assert f"database  {out / 'trace.duckdb'}" in printed
    iterations = json.loads((out / "run" / "run.json").read_text())["tables"]["iterations"]
    assert f"({iterations} itertrace step ranges over {iterations} iterations)" in printed
    assert "traces nvtx,osrt" in printed or "cuda" in machine_traces()
    assert "warning" not in printed


@pytest.mark.nsys
@needs_nsys
def test_every_iteration_has_exactly_one_step_range_with_its_number(con):
    assert one(con, "SELECT runner, device, simulated FROM run_meta") == ("torch", "cpu", False)
    n = one(con, "SELECT count(*) FROM run_iterations")[0]
    assert n >= 8
    per_iteration = con.execute("""
        SELECT i.iteration, count(s.range_id)
        FROM run_iterations i
        LEFT JOIN nvtx_ranges s ON s.domain_name = 'itertrace' AND s.text = 'step' AND s.int64_value = i.iteration
        GROUP BY i.iteration HAVING count(s.range_id) <> 1""").fetchall()
    assert per_iteration == []
    # No step range beyond the logged iterations, all at the top of one thread's stack.
    assert one(con, """
        SELECT count(*), count(DISTINCT int64_value), count(DISTINCT global_tid), max(depth), min(int64_value),
               max(int64_value)
        FROM nvtx_ranges WHERE domain_name = 'itertrace' AND text = 'step'""") == (n, n, 1, 0, 0, n - 1)


@pytest.mark.nsys
@needs_nsys
def test_each_phase_is_a_child_of_its_step_once_per_iteration(con):
    names = ", ".join(f"'{p}'" for p in PHASES)
    counts = con.execute(f"""
        WITH step AS (SELECT range_id, int64_value AS iteration FROM nvtx_ranges
                      WHERE domain_name = 'itertrace' AND text = 'step'),
        phase AS (SELECT unnest([{names}]) AS phase)
        SELECT s.iteration, p.phase, count(c.range_id) AS n
        FROM step s CROSS JOIN phase p
        LEFT JOIN nvtx_ranges c ON c.parent_range_id = s.range_id AND c.text = p.phase
        GROUP BY ALL HAVING n <> 1""").fetchall()
    assert counts == []
    # Every phase range hangs under a step, and the steps' children are exactly the phases, in order.
    assert one(con, f"""
        SELECT count(*) FILTER (WHERE p.text IS DISTINCT FROM 'step'), count(*)
        FROM nvtx_ranges c LEFT JOIN nvtx_ranges p ON p.range_id = c.parent_range_id
        WHERE c.domain_name = 'itertrace' AND c.text IN ({names})""") == (
        0, len(PHASES) * one(con, "SELECT count(*) FROM run_iterations")[0])
    orders = con.execute("""
        SELECT DISTINCT list(c.text ORDER BY c.start_ns)
        FROM nvtx_ranges s JOIN nvtx_ranges c ON c.parent_range_id = s.range_id
        WHERE s.domain_name = 'itertrace' AND s.text = 'step' GROUP BY s.range_id""").fetchall()
    assert orders == [(list(PHASES),)]


@pytest.mark.nsys
@needs_nsys
def test_arrive_and_finish_marks_carry_every_request_id(con):
    requests = sorted(r for (r,) in con.execute("SELECT request_id FROM run_requests").fetchall())
    finished = sorted(r for (r,) in con.execute(
        "SELECT request_id FROM run_requests WHERE finish_ns IS NOT NULL").fetchall())
    assert len(requests) == 6 and finished == requests
    for mark, ids in (("arrive", requests), ("finish", finished)):
        got = con.execute(f"""SELECT int64_value FROM nvtx_marks
                              WHERE domain_name = 'itertrace' AND text = '{mark}' ORDER BY 1""").fetchall()
        assert [r for (r,) in got] == ids, mark
    # Each finish mark falls after the step of the iteration the log says the request finished in began,
    # and before the next step began (the engine marks it at the end of that iteration).
    assert one(con, """
        WITH step AS (SELECT int64_value AS iteration, start_ns,
                             lead(start_ns) OVER (ORDER BY start_ns) AS next_start_ns
                      FROM nvtx_ranges WHERE domain_name = 'itertrace' AND text = 'step')
        SELECT count(*),
               count(*) FILTER (WHERE m.ts_ns >= s.start_ns AND m.ts_ns < coalesce(s.next_start_ns, m.ts_ns + 1))
        FROM run_events e
        JOIN nvtx_marks m ON m.domain_name = 'itertrace' AND m.text = 'finish' AND m.int64_value = e.request_id
        JOIN step s ON s.iteration = e.iteration
        WHERE e.kind = 'finish'""") == (6, 6)


PHASE_DIFFS = """
    WITH step AS (
      SELECT range_id, int64_value AS iteration, dur_ns FROM nvtx_ranges
      WHERE domain_name = 'itertrace' AND text = 'step'),
    traced AS (
      SELECT s.iteration, c.text AS phase, c.dur_ns FROM nvtx_ranges c JOIN step s ON c.parent_range_id = s.range_id
      UNION ALL
      SELECT iteration, 'step', dur_ns FROM step),
    logged AS (
      UNPIVOT (SELECT iteration, dur_ns AS step, schedule_ns AS schedule, prepare_ns AS prepare,
                      forward_ns AS forward, sample_ns AS sample, detokenize_ns AS detokenize,
                      postprocess_ns AS postprocess FROM run_iterations)
      ON step, schedule, prepare, forward, sample, detokenize, postprocess INTO NAME phase VALUE log_ns)
    SELECT l.phase, count(*), max(abs(l.log_ns - t.dur_ns)), median(abs(l.log_ns - t.dur_ns)), median(l.log_ns),
           count(*) FILTER (WHERE abs(l.log_ns - t.dur_ns) >= {bound})
    FROM logged l JOIN traced t ON t.iteration = l.iteration + {shift} AND t.phase = l.phase
    GROUP BY l.phase ORDER BY l.phase"""


@pytest.mark.nsys
@needs_nsys
def test_phase_durations_agree_with_the_run_log_within_nvtx_overhead(con):
    n = one(con, "SELECT count(*) FROM run_iterations")[0]
    diffs = con.execute(PHASE_DIFFS.format(shift=0, bound=BOUND_NS)).fetchall()
    report = "\n".join(f"  {phase:<11} {count:>3} iterations  max |log - nvtx| {worst / 1e3:8.1f} us  "
                       f"median {typical / 1e3:6.1f} us  over the bound {over}  (phase median {length / 1e3:9.1f} us)"
                       for phase, count, worst, typical, length, over in diffs)
    print(f"\nlargest NVTX-vs-log difference per phase (bound {BOUND_NS / 1e3:.0f} us):\n{report}")
    assert sorted(phase for phase, *_ in diffs) == sorted([*PHASES, "step"])
    for phase, count, _, typical, _, over in diffs:
        assert count == n, phase
        # A clock read and its NVTX call are adjacent, but the OS may deschedule the process between
        # them on a loaded machine (a forward once differed by 4 ms with four jobs on two cores, and
        # two phases in 50 missed the bound at a load of 10 on two cores). A preemption lands in that
        # window of microseconds with a chance of about 1 in 400 per phase boundary, so 1 iteration in
        # 10 missing the bound has a chance under one in a million; a wrong join misses it in all.
        assert over <= max(1, count // 10), f"{phase}: {over} iterations differ by {BOUND_NS} ns or more\n{report}"
        assert typical < MEDIAN_BOUND_NS, f"{phase}: median difference {typical} ns\n{report}"
    # The bound tells a right join from a wrong one: one iteration off, forward misses by far more.
    shifted = {phase: worst for phase, _, worst, *_ in con.execute(PHASE_DIFFS.format(shift=1, bound=BOUND_NS)).fetchall()}
    assert shifted["forward"] > BOUND_NS, shifted


@pytest.mark.nsys
@needs_nsys
def test_a_failing_command_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "prof"
    status = main(["profile", "--quiet", "--out", str(out), "--", sys.executable, "-c", "import sys; sys.exit(3)"])
    assert status == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("itertrace: error: ") and "exited with status 3" in err[0], err
    assert not out.exists()
    (out).mkdir()  # an empty folder given as --out stays, empty
    assert main(["profile", "--quiet", "--out", str(out), "--", sys.executable, "-c", "raise SystemExit(5)"]) == 5
    assert out.is_dir() and list(out.iterdir()) == []


@pytest.mark.nsys
@needs_nsys
def test_a_run_directory_the_command_names_itself(tmp_path, capsys):
    """`--out` given to `itertrace run` (here as --out=) is where the run goes, and what is ingested.

    A simulated run under nsys runs every iteration one by one (none in bulk), so each has its step range."""
    out, run = tmp_path / "prof", tmp_path / "elsewhere" / "my-run"
    command = [sys.executable, "-m", "itertrace.cli", "run", "--runner", "simulated", "--workload", "synthetic",
               "--num-requests", "3", "--output-len", "40", f"--out={run}"]
    assert main(["profile", "--quiet", "--out", str(out), "--", *command]) == 0
    assert capsys.readouterr().out.strip() == str(out / "trace.duckdb")
    assert sorted(p.name for p in out.iterdir()) == ["profile.log", "report.nsys-rep", "trace.duckdb"]
    with duckdb.connect(str(out / "trace.duckdb"), read_only=True) as con:
        assert one(con, "SELECT source, runner, simulated FROM run_meta") == (str(run.resolve()), "simulated", True)
        assert one(con, "SELECT count(*) FROM run_iterations") == one(
            con, "SELECT count(*) FROM nvtx_ranges WHERE text = 'step'") == (40,)
    assert json.loads((run / "run.json").read_text())["summary"]["iterations_in_bulk"] == 0


def test_missing_nsys_says_how_to_install_it(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "p"), "--nsys", str(tmp_path / "no-nsys"), "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Nsight Systems not found" in err
    assert "non-free" in err and "nsight-systems-target nsight-systems" in err
    assert not (tmp_path / "p").exists()


def test_no_command(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give the command to profile after --" in err[0], err
    assert not (tmp_path / "p").exists()


@pytest.mark.nsys
@needs_nsys
def test_unknown_program_and_used_folder(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "p"), "--", "no-such-program-here"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["itertrace: error: no-such-program-here: program not found on PATH"]
    assert not (tmp_path / "p").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    assert main(["profile", "--out", str(tmp_path / "used"), "--", "true"]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["x"]


@pytest.mark.parametrize("command, expected", [
    (["/v/bin/itertrace", "run", "--runner", "torch"], (["/v/bin/itertrace", "run", "--runner", "torch", "--out",
                                                          "D/run"], "D/run")),
    (["/v/bin/python", "-m", "itertrace.cli", "run"], (["/v/bin/python", "-m", "itertrace.cli", "run", "--out",
                                                        "D/run"], "D/run")),
    (["/v/bin/python3.11", "-u", "-X", "dev", "-m", "itertrace.cli", "run", "--out", "mine"],
     (["/v/bin/python3.11", "-u", "-X", "dev", "-m", "itertrace.cli", "run", "--out", "mine"], "mine")),
    (["/v/bin/itertrace", "run", "--out=mine"], (["/v/bin/itertrace", "run", "--out=mine"], "mine")),
    (["/v/bin/itertrace", "experiment", "worked-example"], None),
    (["/v/bin/python", "-c", "print('run')"], None),
    (["/usr/bin/make", "run"], None),
])
def test_which_commands_write_a_run_directory(command, expected):
    found = run_target(command, Path("D"))
    if expected is None:
        assert found is None
    else:
        assert (found.command, str(found.run_dir)) == expected


def test_traces_fit_the_machine(tmp_path):
    assert machine_traces(tmp_path) == ("nvtx", "osrt")
    (tmp_path / "nvidiactl").touch()  # the driver's control node alone is no GPU
    (tmp_path / "nvidia-uvm").touch()
    assert machine_traces(tmp_path) == ("nvtx", "osrt")
    (tmp_path / "nvidia0").touch()
    assert machine_traces(tmp_path) == ("nvtx", "osrt", "cuda")


@pytest.mark.nsys
@needs_nsys
@pytest.mark.parametrize("quiet", [False, True])
def test_sigterm_stops_the_profiled_command_and_leaves_nothing(tmp_path, quiet):
    """SIGTERM reaches only itertrace (Ctrl-C reaches the whole process group): it passes it on to nsys,
    which stops the profiled command, instead of waiting for the command to end."""
    token = f"itertrace-sigterm-{os.getpid()}-{quiet}"  # marks the profiled process in /proc
    target = [sys.executable, "-c", f"import pathlib, time; pathlib.Path('started').touch(); time.sleep(600)  # {token}"]
    proc = subprocess.Popen([sys.executable, "-m", "itertrace.cli", "profile", *(["--quiet"] if quiet else []),
                             "--out", str(tmp_path / "prof"), "--", *target], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)  # not the 600 s the command would sleep
    assert proc.returncode == 143 and err.splitlines()[-1] == "itertrace: terminated"
    # profile waited for nsys's agent, which writes the .qdstrm after nsys has ended, before it removed the folder
    assert not (tmp_path / "prof").exists()
    deadline = time.monotonic() + 60  # the profiled command ends when nsys stops it; its exit may lag ours a little
    while any(token in _cmdline(p) for p in Path("/proc").glob("[0-9]*/cmdline")):
        assert time.monotonic() < deadline, f"a process marked {token} outlived the profile"
        time.sleep(0.1)


def _cmdline(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:  # the process has just ended
        return ""


def test_profile_waits_for_the_agent_nsys_left_behind(monkeypatch):
    """nsys's agent runs outside nsys's process tree and goes on writing the capture after nsys has ended:
    wait_for_agent returns only once the agent of that nsys session has ended (gone, or a zombie whose
    status `poll` collects), and leaves another session's agent alone."""
    from itertrace.ingest import nsys

    fake_nsys_pid = 4_000_000 + os.getpid() % 100_000  # above any real PID here: no real agent has it
    # The agent runs until its stdin closes, which happens once wait_for_agent has found it and waits:
    # no moment of this test depends on how fast the machine is.
    agent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "--start-agent",
                              f"--session-name=profile-python3-{fake_nsys_pid}"], stdin=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "--start-agent",
                              f"--session-name=profile-python3-1{fake_nsys_pid}"], stdin=subprocess.PIPE)
    waits = []

    def sleep(seconds: float) -> None:  # wait_for_agent's pause between two looks at the agent
        waits.append(seconds)
        if len(waits) == 1:
            agent.stdin.close()

    try:
        while nsys._agents(fake_nsys_pid) != [agent.pid]:  # until its command line shows
            assert agent.poll() is None
            time.sleep(0.01)
        monkeypatch.setattr(nsys.time, "sleep", sleep)
        nsys.wait_for_agent(fake_nsys_pid)
        assert waits and agent.poll() is not None and other.poll() is None
    finally:
        for proc in (agent, other):
            proc.kill()
            proc.wait()


def test_an_agent_is_followed_by_pid_and_start_time():
    """A process found as the agent runs while its PID names the process that started then; a PID used
    again by a later process, or a zombie, does not run."""
    from itertrace.ingest import nsys

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = nsys._start_time(proc.pid)
        assert nsys._runs(proc.pid, started) and not nsys._runs(proc.pid, started + 1)
        proc.stdin.close()
        while nsys._stat(proc.pid)[0] != "Z":  # it exits; its status is not collected yet
            time.sleep(0.01)
        assert not nsys._runs(proc.pid, started) and proc.poll() == 0
        assert nsys._start_time(proc.pid) is None and not nsys._runs(proc.pid, started)
    finally:
        proc.kill()
        proc.wait()
