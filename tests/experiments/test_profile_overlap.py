"""`itertrace profile` of a torch run in overlap mode: the trace alone gives the run log's iterations, gaps and
latency.

In overlap mode consecutive `step` ranges overlap in time (start/end ranges), the host phases are push/pop
ranges on the engine's thread and each forward pass a `forward` range numbered by its iteration on the
device thread. Trace and log are joined on iteration numbers and request ids, never on clocks; durations
and gaps agree within the NVTX overhead (see test_profile_live.py for the bounds' reasons).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from live_run import BOUND_NS, ITERTRACE, MEDIAN_BOUND_NS, RUN, needs_nsys

from itertrace.queries import QueryDB

pytestmark = [pytest.mark.nsys, needs_nsys]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile-overlap") / "prof"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "itertrace.cli", "profile", "--out", str(out), "--",
                           ITERTRACE, *RUN, "--overlap"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "warning" not in done.stdout, done.stdout
    db = QueryDB(out / "trace.duckdb")  # the query library's views over the capture, read-only
    yield db
    db.close()


def rows(db: QueryDB, sql: str) -> list[tuple]:
    return [tuple(row.values()) for row in db.sql(sql).to_pylist()]


def test_steps_overlap_and_forward_passes_run_on_a_device_thread(con):
    n = rows(con, "SELECT count(*) FROM run_iterations")[0][0]
    assert n >= 8 and rows(con, "SELECT config_json::JSON->>'overlap' FROM run_meta") == [("true",)]
    steps = rows(con, """
        SELECT count(*), count(DISTINCT int64_value), count(DISTINCT global_tid), min(range_kind), max(range_kind),
               min(int64_value), max(int64_value)
        FROM nvtx_ranges WHERE domain_name = 'itertrace' AND text = 'step'""")
    assert steps == [(n, n, 1, "start_end", "start_end", 0, n - 1)]
    forwards = rows(con, """
        SELECT count(*), count(DISTINCT f.int64_value), count(DISTINCT f.global_tid),
               count(*) FILTER (WHERE f.global_tid = s.global_tid)
        FROM nvtx_ranges f JOIN nvtx_ranges s ON s.text = 'step' AND s.int64_value = f.int64_value
        WHERE f.domain_name = 'itertrace' AND f.text = 'forward'""")
    assert forwards == [(n, n, 1, 0)]
    overlapping = rows(con, """
        SELECT count(*) FROM nvtx_ranges a JOIN nvtx_ranges b ON b.text = 'step' AND b.int64_value = a.int64_value + 1
        WHERE a.text = 'step' AND b.start_ns < a.end_ns""")[0][0]
    assert overlapping >= n // 2  # iteration N+1 is scheduled while N runs


def test_iterations_and_their_device_intervals_agree_with_the_run_log(con):
    diffs = rows(con, f"""
        SELECT count(*), count(*) FILTER (WHERE t.device_source = 'range'),
               count(*) FILTER (WHERE abs(t.device_dur_ns - (l.device_end_ns - l.device_start_ns)) >= {BOUND_NS}),
               median(abs(t.device_dur_ns - (l.device_end_ns - l.device_start_ns))),
               count(*) FILTER (WHERE abs(t.host_dur_ns - l.dur_ns) >= {BOUND_NS})
        FROM iterations t JOIN run_iterations l USING (iteration)""")
    n = rows(con, "SELECT count(*) FROM run_iterations")[0][0]
    count, from_range, device_over, device_median, host_over = diffs[0]
    assert (count, from_range) == (n, n)
    assert device_over <= max(1, n // 50) and host_over <= max(1, n // 50), diffs
    assert device_median < MEDIAN_BOUND_NS, diffs


def test_gaps_from_the_trace_agree_with_the_gaps_in_the_run_log(con):
    """The log's gap before iteration N: its forward pass's start less the latest end before it, on the run's
    clock; the trace's: host_gaps, from the forward ranges on the device thread."""
    diffs = rows(con, f"""
        WITH logged AS (
          SELECT iteration, greatest(device_start_ns - max(device_end_ns) OVER (ORDER BY device_start_ns
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS gap_ns
          FROM run_iterations)
        SELECT count(*), count(*) FILTER (WHERE abs(g.gap_ns - l.gap_ns) >= {BOUND_NS}),
               median(abs(g.gap_ns - l.gap_ns)), sum(g.gap_ns), sum(l.gap_ns)
        FROM host_gaps g JOIN logged l USING (iteration)""")
    n = rows(con, "SELECT count(*) FROM run_iterations")[0][0]
    count, over, typical, traced, logged = diffs[0]
    assert count == n - 1 and over <= max(1, n // 50) and typical < MEDIAN_BOUND_NS, diffs
    parts = rows(con, """
        SELECT count(*) FROM (SELECT iteration, sum(dur_ns) AS parts FROM host_gaps_parts GROUP BY iteration) p
        JOIN host_gaps g USING (iteration) WHERE p.parts <> g.gap_ns""")
    assert parts == [(0,)]


def test_latency_from_the_trace_agrees_with_the_run_log(con):
    compare = rows(con, f"""
        SELECT count(*), count(*) FILTER (WHERE output_tokens_log = output_tokens_trace AND output_tokens_log > 0),
               max(abs(ttft_diff_ns)), max(abs(tpot_diff_ns)), max(abs(e2e_diff_ns)), max(itl_abs_diff_max_ns)
        FROM request_latency_compare""")
    requests = rows(con, "SELECT count(*) FROM run_requests")[0][0]
    count, same_tokens, ttft, tpot, e2e, itl = compare[0]
    assert (count, same_tokens) == (requests, requests)
    assert max(ttft, tpot, e2e, itl) < BOUND_NS, compare
