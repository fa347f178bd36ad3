"""`itertrace export perfetto`: the timeline read back by the Kineto ingest gives the same ranges and GPU work."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from profiled_run import profiled_run

from itertrace.cli import main
from itertrace.dashboards.perfetto import export_perfetto
from itertrace.ingest import ingest
from itertrace.queries import QueryDB

KINETO = Path(__file__).resolve().parents[2].parent / "shared" / "kineto_samples"
RANGES = "SELECT text, start_ns, end_ns, pid, tid, depth, domain_name, int64_value FROM nvtx_ranges ORDER BY ALL"
MARKS = "SELECT text, ts_ns, pid, tid, domain_name, int64_value FROM nvtx_marks ORDER BY ALL"
GPU = ("SELECT kind, name, start_ns, end_ns, device_id, stream_id, correlation_id, bytes, pid FROM gpu_ops "
       "ORDER BY ALL")
API = "SELECT name, start_ns, end_ns, pid, tid, correlation_id, event_class FROM cuda_api ORDER BY ALL"
PROJECTION = ("SELECT r.text, r.start_ns, g.gpu_start_ns, g.gpu_end_ns, g.gpu_op_count FROM nvtx_gpu_projection AS g "
              "JOIN nvtx_ranges AS r USING (range_id) ORDER BY ALL")


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def round_trip(db: Path, tmp_path: Path, name: str = "timeline.json.gz", **window) -> tuple[Path, dict]:
    """Export `db`, ingest the export into a new database: (that database, the exported JSON)."""
    out = tmp_path / name
    export_perfetto(db, out, **window)
    back = tmp_path / f"{name}.duckdb"
    ingest([out], back)
    document = json.loads(gzip.decompress(out.read_bytes()) if name.endswith(".gz") else out.read_bytes())
    return back, document


@pytest.mark.shared
@pytest.mark.parametrize("sample", ["resnet_v100_ns_rank0", "alexnet_sync", "amd_mi250_rocm62"])
def test_gpu_work_round_trips(tmp_path, sample):
    trace = KINETO / f"{sample}.json.gz"
    if not trace.exists():
        pytest.skip(f"Kineto samples not found at {KINETO}")
    db = tmp_path / "source.duckdb"
    ingest([trace], db)
    back, _ = round_trip(db, tmp_path)
    for sql in (RANGES, GPU, API, PROJECTION):
        assert rows(back, sql) == rows(db, sql)
    assert rows(back, "SELECT count(*) FROM gpu_ops")[0][0] > 0


def test_live_run_round_trips_with_its_iterations_and_requests(tmp_path_factory, tmp_path):
    made = profiled_run(tmp_path_factory)
    db = tmp_path / "live.duckdb"
    ingest([made.run_dir, made.trace], db)
    back, document = round_trip(db, tmp_path)
    for sql in (RANGES, MARKS):
        assert rows(back, sql) == rows(db, sql)
    events = document["traceEvents"]
    steps = {e["args"]["iteration"]: e["args"] for e in events if e.get("name") == "step"}
    logged = rows(db, "SELECT iteration, member_ids, prefill_tokens, decode_tokens FROM run_iterations")
    assert {i: (a["members"], a["prefill_tokens"], a["decode_tokens"]) for i, a in steps.items()} == \
        {i: (m, p, d) for i, m, p, d in logged}
    # one track per request: queued, its prefill chunks, decode runs with every token after the first, finished
    by_request = Counter()
    decoded = Counter()
    for e in events:
        if e.get("cat") == "itertrace_request":
            by_request[(e["tid"] - 1, e["name"].split(" ")[0])] += 1
            if e["name"] == "decode":
                decoded[e["tid"] - 1] += e["args"]["tokens"]
    requests = rows(db, "SELECT request_id, output_tokens FROM run_requests ORDER BY 1")
    chunks = dict(rows(db, "SELECT request_id, count(*) FROM run_events WHERE kind = 'prefill_chunk' GROUP BY 1"))
    for request_id, tokens in requests:
        assert by_request[(request_id, "finished")] == 1
        assert by_request[(request_id, "prefill")] == chunks[request_id]
        assert decoded[request_id] == tokens - 1
    assert sum(n for (_, name), n in by_request.items() if name == "queued") == len(requests)
    # the host gaps track: each gap's parts fill it exactly
    gaps = [e for e in events if e.get("name") == "host gap"]
    parts = Counter()
    for e in events:
        if e.get("cat") == "itertrace_gap" and e["name"] != "host gap":
            parts[e["ts"] < min(g["ts"] for g in gaps)] += 1
    with QueryDB(db) as qdb:
        expected = qdb.sql("SELECT count(*) FROM host_gaps WHERE gap_ns > 0").column(0)[0].as_py()
    assert len(gaps) == expected > 0 and parts[True] == 0
    assert all(isinstance(e["ts"], (int, float)) for e in events if e["ph"] != "M")


def test_window_of_iterations(tmp_path_factory, tmp_path):
    made = profiled_run(tmp_path_factory)
    db = tmp_path / "live.duckdb"
    ingest([made.run_dir, made.trace], db)
    total = rows(db, "SELECT count(*) FROM run_iterations")[0][0]
    back, document = round_trip(db, tmp_path, "window.json", first=2, last=4)
    steps = [e["args"]["iteration"] for e in document["traceEvents"] if e.get("name") == "step"]
    assert sorted(steps) == [2, 3, 4] and total > 5
    assert document["otherData"]["itertrace_export"]["window"] == f"iterations 2-4 of {total}"
    with QueryDB(db) as qdb:
        lo, hi = qdb.sql("SELECT min(host_start_ns), max(greatest(host_end_ns, device_end_ns)) FROM iterations "
                         "WHERE iteration BETWEEN 2 AND 4").to_pylist()[0].values()
    inside = f"WHERE (start_ns < {hi} AND end_ns > {lo}) OR (start_ns = end_ns AND start_ns BETWEEN {lo} AND {hi})"
    assert rows(back, RANGES) == rows(db, RANGES.replace("ORDER BY", f"{inside} ORDER BY"))


def test_run_log_alone(tmp_path):
    run = tmp_path / "sim"
    assert main(["run", "--workload", "worked-example", "--capacity", "4", "--out", str(run), "--format", "json"]) == 0
    db = tmp_path / "sim.duckdb"
    ingest([run], db)
    out = tmp_path / "sim.json"
    written = export_perfetto(db, out, first=0, last=9)
    events = json.loads(out.read_text())["traceEvents"]
    assert sorted(e["args"]["iteration"] for e in events if e.get("cat") == "itertrace_iteration") == list(range(10))
    assert written.window.describe().startswith("iterations 0-9 of ")
    admitted = dict(rows(db, "SELECT request_id, min(iteration) FROM run_events WHERE kind = 'admit' GROUP BY 1"))
    shown: dict[int, set[str]] = {}
    for e in events:
        if e.get("cat") == "itertrace_request":
            shown.setdefault(e["tid"] - 1, set()).add(e["name"].split(" ")[0])
    assert set(shown) == set(admitted)  # all arrive at once: every one is queued in the first iterations
    assert {r for r, names in shown.items() if "prefill" in names} == {r for r, i in admitted.items() if i <= 9}
    assert all(names == {"queued"} for r, names in shown.items() if admitted[r] > 9)


def test_nsys_samples_round_trip(sample_dbs, tmp_path):
    """The worked example's live torch runs, captured by nsys (sample_traces/): ranges and marks come back."""
    for mode, db in sample_dbs.items():
        (tmp_path / mode).mkdir()
        back, _ = round_trip(db, tmp_path / mode)
        for sql in (RANGES, MARKS):
            assert rows(back, sql) == rows(db, sql), mode


def test_bad_requests(tmp_path, capsys):
    run = tmp_path / "sim"
    assert main(["run", "--workload", "worked-example", "--capacity", "4", "--out", str(run), "--format", "json"]) == 0
    db = tmp_path / "sim.duckdb"
    ingest([run], db)
    capsys.readouterr()
    for argv, expected in (
        (["-o", str(tmp_path / "t.txt")], "name the file .json or .json.gz"),
        (["-o", str(tmp_path / "t.json"), "--from-iteration", "5", "--to-iteration", "2"], "before --from-iteration"),
        (["-o", str(tmp_path / "t.json"), "--from-iteration", "100000"], "no iteration in 100000..end"),
        (["-o", str(tmp_path / "no" / "t.json")], "does not exist"),
    ):
        assert main(["export", "perfetto", "--db", str(db), *argv]) == 2
        assert expected in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim", "sim.duckdb"]


def test_the_timeline_replaces_only_a_timeline_it_wrote(tmp_path, capsys):
    """-o refuses any file the export did not write (a settings file, a Kineto trace such as `ingest` reads,
    the database itself) and leaves it as it was; a timeline it wrote before is replaced."""
    run = tmp_path / "sim"
    assert main(["run", "--workload", "worked-example", "--capacity", "4", "--out", str(run), "--format", "json"]) == 0
    db = tmp_path / "sim.duckdb"
    ingest([run], db)
    kineto = {"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                                                   "ts": 1.0, "dur": 2.0, "args": {"correlation": 1}}]}
    targets = {"settings.json": b'{"theme": "dark", "fontSize": 14}\n',
               "rank0.pt.trace.json.gz": gzip.compress(json.dumps(kineto).encode()),
               "rank0.pt.trace.json": json.dumps(kineto).encode(),
               "empty-looking.json": b'{"otherData": {}, "traceEvents": []}'}
    for name, data in targets.items():
        (tmp_path / name).write_bytes(data)
    capsys.readouterr()
    for name in [*targets, "sim.duckdb"]:
        assert main(["export", "perfetto", "--db", str(db), "-o", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(tmp_path / name) in err[0], err
        assert ("name the file .json" if name == "sim.duckdb" else "holds something other than a timeline") in err[0]
    assert {name: (tmp_path / name).read_bytes() for name in targets} == targets
    for name in ("again.json", "again.json.gz"):
        assert main(["export", "perfetto", "--db", str(db), "-o", str(tmp_path / name), "--quiet"]) == 0
        assert main(["export", "perfetto", "--db", str(db), "-o", str(tmp_path / name), "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*targets, "sim", "sim.duckdb", "again.json",
                                                                 "again.json.gz"])
