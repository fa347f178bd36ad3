"""The capture a run log stands for (queries/sources/run_log.sql), on a database of a run directory alone: its
tables are the ingest's, column for column, and the trace views over it say what the log says."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from query_fixtures import create_statements, insert

from itertrace.ingest import ingest
from itertrace.queries import QueryDB
from itertrace.queries.library import RUN_LOG_TABLES

SAMPLE_RUN = Path(__file__).resolve().parents[2] / "sample_traces" / "worked-example-continuous" / "run"

# (iteration, start, end, schedule, prepare, forward, sample, device start, device end): phases end to end;
# iteration 2 ran no forward pass (its schedule phase alone)
LOG = [(0, 0, 100, 10, 10, 50, 30, 20, 70), (1, 100, 180, 5, 15, 40, 20, 120, 160),
       (2, 180, 190, 10, 0, 0, 0, None, None), (3, 200, 260, 0, 20, 30, 10, 220, 250)]
# request 7 gets tokens in 0 and 1, request 8 in 1 and 3 (not in 2: no forward pass)
TOKENS = [(7, 0, "first_token"), (7, 1, "token"), (8, 1, "first_token"), (8, 3, "token")]


def log_db(path, overlap: bool = False) -> str:
    con = duckdb.connect(str(path))
    for statement in create_statements():
        if statement.split()[2].startswith("run_"):
            con.execute(statement)
    insert(con, {
        "run_iterations": [dict(zip(("iteration", "start_ns", "end_ns", "schedule_ns", "prepare_ns", "forward_ns",
                                     "sample_ns", "device_start_ns", "device_end_ns"), row),
                                detokenize_ns=0, postprocess_ns=0, dur_ns=row[2] - row[1],
                                num_seqs=0 if row[7] is None else 1) for row in LOG],
        "run_events": [{"request_id": r, "iteration": i, "kind": k, "ts_ns": 0} for r, i, k in TOKENS]
                      + [{"request_id": r, "iteration": None, "kind": "arrive", "ts_ns": 0} for r in (7, 8)],
        "run_meta": [{"config_json": json.dumps({"overlap": overlap})}],
    })
    con.close()
    return str(path)


def test_the_stand_ins_have_the_ingests_columns(tmp_path):
    ingest = duckdb.connect()
    for statement in create_statements():
        ingest.execute(statement)
    with QueryDB(log_db(tmp_path / "log.duckdb")) as q:
        for table in sorted(RUN_LOG_TABLES):
            assert q.rows(f"DESCRIBE {table}") == ingest.execute(f"DESCRIBE {table}").fetchall(), table


def test_iterations_and_phases_are_the_logs(tmp_path):
    with QueryDB(log_db(tmp_path / "log.duckdb")) as q:
        its = q.rows("SELECT iteration, host_start_ns, host_end_ns, device_start_ns, device_end_ns, device_source "
                     "FROM iterations ORDER BY iteration")
        leaves = q.rows("SELECT l.start_ns, l.end_ns, n.phase FROM host_gaps_leaves AS l "
                        "JOIN host_gaps_phase_names AS n USING (phase_rank) ORDER BY 1, 2")
        gaps = q.rows("SELECT prev_iteration, iteration, gap_ns FROM host_gaps ORDER BY gap_start_ns")
    assert its == [(0, 0, 100, 20, 70, "range"), (1, 100, 180, 120, 160, "range"), (2, 180, 190, None, None, None),
                   (3, 200, 260, 220, 250, "range")]
    assert leaves == [(0, 10, "schedule"), (10, 20, "prepare"), (20, 70, "forward"), (70, 100, "sample"),
                      (100, 105, "schedule"), (105, 120, "prepare"), (120, 160, "forward"), (160, 180, "sample"),
                      (180, 190, "schedule"), (200, 220, "prepare"), (220, 250, "forward"), (250, 260, "sample")]
    assert gaps == [(0, 1, 50), (1, 3, 60)]


def test_tokens_are_the_logs(tmp_path):
    with QueryDB(log_db(tmp_path / "log.duckdb")) as q:
        traced = q.rows("SELECT request_id, iteration, ts_ns FROM request_latency_trace_tokens ORDER BY 1, 2")
    assert traced == [(7, 0, 100), (7, 1, 180), (8, 1, 180), (8, 3, 260)]


@pytest.mark.parametrize("overlap", [False, True])
def test_overlap_mode_has_forward_ranges_and_no_phases(overlap, tmp_path):
    with QueryDB(log_db(tmp_path / "log.duckdb", overlap)) as q:
        kinds = q.rows("SELECT text, range_kind, global_tid, count(*) FROM nvtx_ranges GROUP BY ALL ORDER BY ALL")
        devices = q.rows("SELECT iteration, device_start_ns, device_end_ns FROM iterations "
                         "WHERE device_start_ns IS NOT NULL ORDER BY 1")
    assert devices == [(0, 20, 70), (1, 120, 160), (3, 220, 250)]
    if overlap:
        assert kinds == [("forward", "push_pop", 2, 3), ("step", "start_end", 1, 4)]
    else:
        assert [k[0] for k in kinds] == ["detokenize", "forward", "postprocess", "prepare", "sample", "schedule", "step"]


def test_an_older_engines_log_without_device_times(tmp_path):
    """A run directory an older engine wrote (no device_start_ns, device_end_ns, dropped_tokens columns): the
    ingest holds them as NULL, and the capture rebuilt from it has each iteration's phases as the log times them."""
    import pyarrow.parquet as pq

    assert "device_start_ns" not in pq.read_schema(SAMPLE_RUN / "iterations.parquet").names
    db = tmp_path / "old.duckdb"
    ingest([SAMPLE_RUN], db)
    with QueryDB(db) as q:
        nulls = q.rows("SELECT count(device_start_ns), count(device_end_ns), count(dropped_tokens), count(*) "
                       "FROM run_iterations")
        leaves = q.rows("SELECT i.iteration, n.phase, sum(l.end_ns - l.start_ns) FROM host_gaps_leaves AS l "
                        "JOIN iterations AS i ON l.start_ns >= i.host_start_ns AND l.start_ns < i.host_end_ns "
                        "JOIN host_gaps_phase_names AS n USING (phase_rank) GROUP BY ALL ORDER BY ALL")
        logged = q.rows("SELECT iteration, p.name, p.ns FROM run_iterations, unnest(["
                        "{'name': 'detokenize', 'ns': detokenize_ns}, {'name': 'forward', 'ns': forward_ns}, "
                        "{'name': 'postprocess', 'ns': postprocess_ns}, {'name': 'prepare', 'ns': prepare_ns}, "
                        "{'name': 'sample', 'ns': sample_ns}, {'name': 'schedule', 'ns': schedule_ns}]) AS u(p) "
                        "WHERE (num_seqs > 0 OR p.name = 'schedule') AND p.ns > 0 ORDER BY ALL")
    assert nulls[0][:3] == (0, 0, 0) and nulls[0][3] == 512
    assert leaves == logged
