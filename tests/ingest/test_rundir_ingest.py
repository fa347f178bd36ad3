"""The engine's run directory as an ingest source: exact tables, documentation, bad input, repeatability."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from export_closing import closing_tables
from itertrace.cli import main
from itertrace.ingest import ingest
from itertrace.ingest.run_schema import META_COLUMNS, RUN_TABLES
from itertrace.profiler.tracing.runlog import TABLES as ENGINE_TABLES

TABLES = {"iterations": "run_iterations", "events": "run_events", "requests": "run_requests"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small simulated run: 12 requests through 4 slots, KV tight enough to preempt."""
    out = tmp_path_factory.mktemp("engine") / "run"
    status = main(["run", "--runner", "simulated", "--workload", "synthetic", "--num-requests", "12",
                   "--prompt-len", "uniform:4:40", "--output-len", "uniform:1:24", "--capacity", "4",
                   "--block-size", "4", "--num-blocks", "24", "--seed", "3", "--out", str(out), "--format", "json"])
    assert status == 0
    return out


@pytest.fixture
def copy(run_dir, tmp_path) -> Path:
    """A copy of the run directory that a test may damage."""
    return Path(shutil.copytree(run_dir, tmp_path / "damaged"))


def fails(capsys, *argv: str) -> str:
    """Run `itertrace` and return its one error line, checking the status and that nothing else was printed."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: "), captured.err
    assert captured.out == ""
    return lines[0]


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def test_tables_equal_the_files_row_for_row(run_dir, tmp_path):
    db = tmp_path / "run.duckdb"
    result = ingest([run_dir], db)
    assert result.kinds == ("run",)
    with duckdb.connect(str(db), read_only=True) as con:
        for stem, table in TABLES.items():
            expected = pq.read_table(run_dir / f"{stem}.parquet")
            got = con.sql(f"SELECT * FROM {table}").arrow().read_all()
            assert got.column_names == expected.column_names
            assert got.num_rows == expected.num_rows > 0
            assert got.to_pylist() == expected.to_pylist()  # every value, in file order
        meta = json.loads((run_dir / "run.json").read_text())
        assert result.rows == sum(meta["tables"].values()) + 1  # + the run_meta row
        assert rows(con, "SELECT count(*) FROM run_iterations") == [(meta["tables"]["iterations"],)]


def test_a_few_exact_values(run_dir, tmp_path):
    db = tmp_path / "run.duckdb"
    ingest([run_dir], db)
    iterations = pq.read_table(run_dir / "iterations.parquet").to_pylist()
    requests = pq.read_table(run_dir / "requests.parquet").to_pylist()
    last = iterations[-1]
    with duckdb.connect(str(db), read_only=True) as con:
        assert rows(con, f"SELECT end_ns, forward_ns, member_ids, kv_in_use FROM run_iterations "
                         f"WHERE iteration = {last['iteration']}") == [
            (last["end_ns"], last["forward_ns"], last["member_ids"], last["kv_in_use"])]
        assert rows(con, "SELECT sum(decode_tokens + prefill_tokens), max(iteration) FROM run_iterations") == [
            (sum(r["decode_tokens"] + r["prefill_tokens"] for r in iterations), len(iterations) - 1)]
        assert rows(con, "SELECT request_id, output_tokens, final_state, first_token_ns FROM run_requests "
                         "ORDER BY request_id LIMIT 1") == [
            (requests[0]["request_id"], requests[0]["output_tokens"], requests[0]["final_state"],
             requests[0]["first_token_ns"])]
        assert rows(con, "SELECT count(*) FROM run_events WHERE kind = 'finish'") == [
            (sum(r["final_state"].startswith("finished") for r in requests),)]


def test_run_meta_is_run_json(run_dir, tmp_path):
    db = tmp_path / "run.duckdb"
    ingest([run_dir], db)
    meta = json.loads((run_dir / "run.json").read_text())
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.sql("SELECT * FROM run_meta").arrow().read_all().to_pylist()
    assert len(got) == 1
    row = got[0]
    assert list(row) == [name for name, _, _ in META_COLUMNS]
    assert row["run_id"] == hashlib.sha256((run_dir / "run.json").read_bytes()).hexdigest()[:16]
    assert (row["run_name"], row["source"]) == ("run", str(run_dir.resolve()))
    assert {key: row[key] for key in ("format", "runner", "simulated", "device", "workload", "seed",
                                      "clock_source", "clock_epoch_unix_ns")} == {
        "format": "itertrace-run/1", "runner": "simulated", "simulated": True, "device": meta["device"],
        "workload": "synthetic", "seed": 3, "clock_source": "simulated", "clock_epoch_unix_ns": 0}
    assert (row["mode"], row["policy"], row["capacity"]) == ("continuous", "fcfs", 4)
    assert json.loads(row["config_json"]) == meta["config"]
    assert json.loads(row["versions_json"]) == meta["versions"]
    assert json.loads(row["summary_json"]) == meta["summary"]
    assert (row["iterations"], row["events"], row["requests"]) == (
        meta["tables"]["iterations"], meta["tables"]["events"], meta["tables"]["requests"])


def test_every_column_is_commented_and_the_docs_follow_the_engine(run_dir, tmp_path):
    db = tmp_path / "run.duckdb"
    ingest([run_dir], db)
    with duckdb.connect(str(db), read_only=True) as con:
        undocumented = rows(con, "SELECT table_name, column_name FROM duckdb_columns() WHERE table_name LIKE 'run\\_%' "
                                 "ESCAPE '\\' AND (comment IS NULL OR comment = '')")
        tables = rows(con, "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'run\\_%' ESCAPE '\\' "
                           "AND comment <> '' ORDER BY 1")
        extra = rows(con, "SELECT count(*) FROM duckdb_columns() WHERE comment LIKE '%does not describe%'")
    assert undocumented == []
    assert tables == [("run_events",), ("run_iterations",), ("run_meta",), ("run_requests",)]
    assert extra == [(0,)]  # every column the engine writes today is described
    for spec in RUN_TABLES:  # and every column it writes is one the loader checks
        engine = ENGINE_TABLES[spec.stem]
        assert set(engine.names) == set(spec.columns), spec.stem
        for field in engine:
            assert spec.columns[field.name][0].matches(field.type), (spec.stem, field.name)


def test_a_column_the_engine_adds_later_passes_through_documented(copy, tmp_path):
    table = pq.read_table(copy / "requests.parquet")
    pq.write_table(table.append_column("queue_class", pa.array(["a"] * table.num_rows)), copy / "requests.parquet")
    db = tmp_path / "run.duckdb"
    ingest([copy], db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert rows(con, "SELECT comment FROM duckdb_columns() WHERE table_name = 'run_requests' "
                         "AND column_name = 'queue_class'") == [
            ("Column of requests.parquet that this version of itertrace does not describe; kept as the file has it.",)]


def test_ingesting_twice_gives_identical_tables(run_dir, tmp_path):
    first, second = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    ingest([run_dir], first)
    ingest([run_dir], second)
    assert dump(first) == dump(second)


def dump(db: Path) -> dict[str, object]:
    """Every table's rows in storage order and every comment of a database."""
    with duckdb.connect(str(db), read_only=True) as con:
        names = rows(con, "SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL")
        out: dict[str, object] = {f"{s}.{t}": con.execute(f'SELECT * FROM "{s}"."{t}"').fetchall() for s, t in names}
        out["comments"] = rows(con, "SELECT table_name, column_name, comment FROM duckdb_columns() "
                                    "WHERE database_name = current_database() ORDER BY ALL")
    return out


def step_export(run_dir: Path, path: Path) -> Path:
    """An Arrow export in nsys's layout whose itertrace step ranges carry the run's iteration numbers."""
    iterations = pq.read_table(run_dir / "iterations.parquet", columns=["iteration", "forward_ns"]).to_pylist()
    tid = (4242 << 24) | 4243
    events = {"start": [0], "end": [None], "eventType": [75], "text": ["itertrace"], "domainId": [1],
              "globalTid": [tid], "int64Value": [None]}
    for i, row in enumerate(iterations):
        start = 20_000_000 * (i + 1)
        forward_end = start + 100_000 + row["forward_ns"] // 100
        for text, begin, end, payload in (("step", start, start + 10_000_000, row["iteration"]),
                                          ("forward", start + 100_000, forward_end, None)):
            for column, value in (("start", begin), ("end", end), ("eventType", 59), ("text", text), ("domainId", 1),
                                  ("globalTid", tid), ("int64Value", payload)):
                events[column].append(value)
    table = pa.table({"start": pa.array(events["start"], pa.int64()), "end": pa.array(events["end"], pa.int64()),
                      "eventType": pa.array(events["eventType"], pa.uint32()),
                      "text": pa.array([t.encode() for t in events["text"]], pa.binary()),
                      "domainId": pa.array(events["domainId"], pa.uint32()),
                      "globalTid": pa.array(events["globalTid"], pa.uint64()),
                      "int64Value": pa.array(events["int64Value"], pa.int64())})
    with open(path, "wb") as sink:
        for name, t in {"NVTX_EVENTS": table, **closing_tables()}.items():
            with ipc.new_stream(sink, t.schema.with_metadata({"table_name": name})) as w:
                w.write_table(t)
    return path


def test_run_directory_and_a_capture_in_one_database(run_dir, tmp_path, capsys):
    export = step_export(run_dir, tmp_path / "capture.arrow")
    db = tmp_path / "both.duckdb"
    assert main(["ingest", str(export), str(run_dir), "--db", str(db)]) == 0  # any order of sources
    assert "from 2 sources" in capsys.readouterr().err
    with duckdb.connect(str(db), read_only=True) as con:
        joined = rows(con, """
            SELECT count(*), count(s.range_id), count(DISTINCT s.range_id), bool_and(f.dur_ns * 100 <= i.forward_ns)
            FROM run_iterations i
            LEFT JOIN nvtx_ranges s ON s.text = 'step' AND s.domain_name = 'itertrace' AND s.int64_value = i.iteration
            LEFT JOIN nvtx_ranges f ON f.parent_range_id = s.range_id AND f.text = 'forward'""")
        n = rows(con, "SELECT iterations FROM run_meta")[0][0]
        assert joined == [(n, n, n, True)]
        assert rows(con, "SELECT count(*) FROM nsys.NVTX_EVENTS") == [(2 * n + 1,)]


# Bad input: one line naming the file, status 2, nothing written.

def test_missing_run_json_is_an_incomplete_run(copy, target, capsys):
    (copy / "run.json").unlink()
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert f"{copy / 'run.json'}: missing" in line and "incomplete run directory" in line


def test_a_run_that_never_closed(copy, target, capsys):
    (copy / "run.json").unlink()
    for name in ("iterations", "events", "requests"):
        (copy / f"{name}.parquet").rename(copy / f"{name}.parquet.partial")
    (copy / "run.json.partial").write_text("{")
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert "incomplete run directory" in line and "did not close" in line


@pytest.mark.parametrize("name", ["iterations", "events", "requests"])
def test_missing_parquet_file(copy, target, capsys, name):
    (copy / f"{name}.parquet").unlink()
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert f"{copy / name}.parquet: missing from the run directory" in line


@pytest.mark.parametrize("keep", [0.5, 0.9, 0])
def test_truncated_parquet_file(copy, target, capsys, keep):
    file = copy / "iterations.parquet"
    whole = file.read_bytes()
    file.write_bytes(whole[: int(len(whole) * keep)])
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert str(file) in line and ("truncated" in line or "empty file" in line)


def test_corrupt_data_inside_a_complete_looking_parquet_file(copy, target, capsys):
    file = copy / "events.parquet"
    table = pq.read_table(file)
    pq.write_table(table, file, compression="zstd")
    whole = bytearray(file.read_bytes())
    whole[8:200] = b"\xa5" * 192  # column pages garbled; footer intact
    file.write_bytes(bytes(whole))
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert str(file) in line


def test_wrong_columns(copy, target, capsys):
    file = copy / "requests.parquet"
    table = pq.read_table(file)
    pq.write_table(table.drop_columns(["arrival_ns", "final_state"]), file)
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert f"{file}: no column arrival_ns; no column final_state" in line
    table = pq.read_table(copy / "iterations.parquet")
    index = table.schema.get_field_index("forward_ns")
    pq.write_table(table.set_column(index, "forward_ns", table["forward_ns"].cast(pa.string())),
                   copy / "iterations.parquet")
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert "iterations.parquet: column forward_ns is string, expected an integer" in line


def test_files_from_another_run(copy, run_dir, target, capsys):
    table = pq.read_table(copy / "events.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), copy / "events.parquet")
    line = fails(capsys, "ingest", str(copy), "--db", str(target))
    assert f"events.parquet: {table.num_rows - 1} rows, but run.json says {table.num_rows}" in line


@pytest.mark.parametrize("text, said", [
    ("{not json", "run.json: not valid JSON"),
    ("[1, 2]", "run.json: expected a JSON object"),
    ('{"format": "something-else"}', "run.json: format 'something-else', expected 'itertrace-run/1'"),
    ('{"format": "itertrace-run/2"}', "written by another version of itertrace"),
    ('{"format": "itertrace-run/1", "runner": "torch"}', "run.json: missing simulated, device"),
])
def test_bad_run_json(copy, target, capsys, text, said):
    (copy / "run.json").write_text(text)
    assert said in fails(capsys, "ingest", str(copy), "--db", str(target))


def test_run_json_value_of_the_wrong_type(copy, target, capsys):
    meta = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps(dict(meta, seed="three")))
    assert "run.json: seed is str, expected int" in fails(capsys, "ingest", str(copy), "--db", str(target))


def test_two_runs_in_one_database(run_dir, copy, target, capsys):
    line = fails(capsys, "ingest", str(run_dir), str(copy), "--db", str(target))
    assert f"{copy}: a database holds one run directory" in line


@pytest.mark.parametrize("name", ["events.parquet", "run.json"])
def test_db_that_would_overwrite_a_file_of_the_run(copy, capsys, name):
    kept = (copy / name).read_bytes()
    line = fails(capsys, "ingest", str(copy), "--db", str(copy / name))
    assert f"{copy / name}: the database would overwrite a file of the source {copy}" in line
    assert (copy / name).read_bytes() == kept
    assert main(["ingest", str(copy), "--db", str(copy / "trace.duckdb"), "--quiet"]) == 0  # a new file there is fine


SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_a_run_directory_beside_another_runs_capture_gets_a_note(tmp_path, capsys):
    if shutil.which("nsys") is None:
        pytest.skip("nsys (Nsight Systems) is not installed: the sample report cannot be exported")
    static, continuous = SAMPLES / "worked-example-static", SAMPLES / "worked-example-continuous"
    capture = continuous / "report.nsys-rep"
    assert ingest([continuous / "run", capture], tmp_path / "own.duckdb").notes == ()  # its own run
    # The static run has iterations 0..543 as the capture's steps 0..511 have, but of other lengths.
    assert main(["ingest", str(static / "run"), str(capture), "--db", str(tmp_path / "crossed.duckdb")]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "itertrace: note: 66% of the capture's step ranges differ in length from the run log's iteration of the "
        "same number by over 5% + 0.1 ms: the run directory looks like another run's")
    # A simulated run of 384 iterations: the capture numbers 128 steps past its end.
    assert main(["run", "--num-requests", "40", "--out", str(tmp_path / "sim"), "--format", "json"]) == 0
    capsys.readouterr()
    result = ingest([tmp_path / "sim", capture], tmp_path / "sim.duckdb")
    assert result.notes == ("128 of the capture's 512 step ranges number iterations the run log does not have "
                            "(384 iterations): the run directory looks like another run's",)
