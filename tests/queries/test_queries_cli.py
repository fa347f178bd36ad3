"""`itertrace query` and `itertrace sql`: listing, formats, output files, and one clear line for bad input."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil

import duckdb
import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from itertrace.queries import QueryDB
from itertrace.queries.catalog import queries
from query_fixtures import create_statements


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def run_only_db(tmp_path_factory):
    """A database with the engine's run tables only, as ingesting a simulated run gives."""
    from itertrace.ingest import ingest
    folder = tmp_path_factory.mktemp("run_only")
    run = folder / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--capacity", "8", "--mode", "static",
                     "--out", str(run), "--format", "json"]) == 0
    db = folder / "run.duckdb"
    ingest([run], db)
    return db


@pytest.fixture(scope="module")
def capture_only_db(tmp_path_factory):
    """A database with a capture's tables only (empty), as ingesting a capture without its run directory gives."""
    db = tmp_path_factory.mktemp("capture_only") / "capture.duckdb"
    with duckdb.connect(str(db)) as con:
        for statement in create_statements():
            if not statement.split()[2].startswith("run_"):
                con.execute(statement)
    return db


def test_list_names_every_public_view_once_with_a_line(capsys):
    rc, out, _ = _run(capsys, "query", "--list")
    assert rc == 0
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert listed == list(queries()) and len(listed) == len(set(listed)) >= 20
    assert all(not name.startswith("_") for name in listed)


def test_describe_shows_columns_and_parameters(capsys):
    rc, out, _ = _run(capsys, "query", "host_gaps_worst", "--describe")
    assert rc == 0
    assert "top_phase" in out and "limit:" in out and "step_pattern:" in out and "needs tables: nvtx_ranges" in out
    assert "limit: How many gaps host_gaps_worst lists; 10 when not given. At least 0." in out


def test_every_public_column_is_documented():
    for query in queries().values():
        assert query.doc.text, query.name
        assert query.doc.columns and all(query.doc.columns.values()), query.name


def test_formats_carry_the_same_rows(capsys, run_only_db, tmp_path):
    rc, out, _ = _run(capsys, "query", "membership_slot_time", "--db", str(run_only_db), "--format", "csv")
    assert rc == 0
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert (row["mode"], row["iterations"], row["finished"]) == ("static", "544", "3360")
    rc, out, _ = _run(capsys, "query", "membership_slot_time", "--db", str(run_only_db), "--format", "json")
    assert json.loads(out)[0]["finished"] == 3360
    target = tmp_path / "m.parquet"
    rc, _, err = _run(capsys, "query", "membership", "--db", str(run_only_db), "--format", "parquet",
                      "--out", str(target))
    assert rc == 0 and "wrote 4,352 rows" in err
    assert pq.read_table(target).num_rows == 4352 and not list(tmp_path.glob(".m.parquet.*"))


def test_table_format_shows_the_first_rows_and_says_how_many_more(capsys, run_only_db):
    rc, out, _ = _run(capsys, "query", "membership_iterations", "--db", str(run_only_db), "--max-rows", "5")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 2 + 5 + 1
    assert lines[0].split()[:3] == ["iteration", "dur_ns", "capacity"]
    assert lines[-1].startswith("... 539 more rows (544 in all")


def test_parameters_reach_the_views(capsys, run_only_db):
    rc, out, _ = _run(capsys, "query", "fairness_progress", "--db", str(run_only_db), "--param", "request_id=3",
                      "--format", "json")
    rows = json.loads(out)
    assert rc == 0 and {r["request_id"] for r in rows} == {3} and len(rows) == 32
    rc, out, _ = _run(capsys, "query", "fairness_progress", "--db", str(run_only_db), "--format", "json")
    assert {r["request_id"] for r in json.loads(out)} == {7}  # the 512-token request by default


def test_sql_runs_over_the_installed_views(capsys, run_only_db):
    rc, out, _ = _run(capsys, "sql", "--db", str(run_only_db), "--format", "csv",
                      "SELECT state, count(*) AS n FROM membership GROUP BY state ORDER BY state;")
    assert rc == 0 and out.splitlines() == ["state,n", "finished,3360", "working,992"]


def test_install_writes_documented_views_any_duckdb_client_can_read(capsys, run_only_db, tmp_path):
    db = tmp_path / "copy.duckdb"
    shutil.copyfile(run_only_db, db)
    rc, _, err = _run(capsys, "query", "--install", "--db", str(db))
    assert rc == 0 and "installed" in err
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT finished FROM membership_slot_time").fetchall() == [(3360,)]
        comment = con.execute("""SELECT comment FROM duckdb_columns()
                                 WHERE table_name = 'membership' AND column_name = 'state'""").fetchall()
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert comment[0][0].startswith("'working'")
    # a run directory alone: the capture its log stands for is a view of a session, never written into the file
    assert "host_gaps" not in views and "nvtx_ranges" not in views
    with QueryDB(db) as q:  # a session over the same file has them
        assert q.rows("SELECT count(*) FROM host_gaps") == \
            q.rows("SELECT count(*) - 1 FROM run_iterations WHERE device_start_ns IS NOT NULL")
        assert "nvtx_ranges" in q.missing and "nvtx_ranges" not in q.lacking


@pytest.mark.parametrize("argv, message", [
    (["query", "no_such_query", "--db", "{db}"], "unknown query 'no_such_query'; `itertrace query --list`"),
    (["query", "host_gap", "--db", "{db}"], "did you mean host_gaps?"),
    (["query", "membership"], "--db FILE is required"),
    (["query", "membership", "--db", "{missing}"], "no such database"),
    (["query", "membership", "--db", "{db}", "--param", "limit=3"], "query membership takes no parameter 'limit'"),
    (["query", "membership", "--db", "{db}", "--param", "nope=3"], "--param nope: unknown parameter"),
    (["query", "membership", "--db", "{db}", "--param", "oops"], "expected KEY=VALUE"),
    (["query", "host_gaps_worst", "--db", "{db}", "--param", "limit=ten"], "parameter limit must be an integer"),
    (["query", "fairness", "--db", "{db}", "--param", "repeat_threshold=x"], "must be an integer"),
    (["query", "membership", "--db", "{db}", "--format", "parquet"], "--format parquet needs --out FILE"),
    (["query", "membership", "--db", "{db}", "--format", "xml"], "invalid choice: 'xml'"),
    (["query", "membership", "--db", "{capture}"], "query membership needs table run_iterations"),
    (["query", "membership", "--db", "{notdb}"], "not a DuckDB database"),
    (["sql", "--db", "{capture}", "SELECT * FROM membership"], "view membership is not available"),
    (["sql", "--db", "{db}", "SELEC 1"], "syntax error"),
    (["query", "iterations", "--db", "{db}", "--param", "preset=other"], "preset must be one of auto, generic, itertrace, sglang, vllm"),
    (["sql", "--db", "{db}", "--param", "step_pattern=((", "SELECT 1"],
     "parameter step_pattern: '((' is not a regular expression (missing ): (()"),
    (["query", "fairness", "--db", "{db}", "--param", "repeat_threshold=99999999999999999999"],
     "parameter repeat_threshold is out of range"),
    (["sql", "--db", "{db}", " ; "], "sql: the statement is empty"),
    (["sql", "--db", "{db}", "SELECT 1; SELECT 2"], "sql: 2 statements given; give one"),
    (["query", "host_gaps_worst", "--db", "{db}", "--param", "limit=-1"], "parameter limit must be at least 0, not '-1'"),
    (["query", "fairness", "--db", "{db}", "--param", "repeat_threshold=0"], "repeat_threshold must be at least 1"),
    (["query", "membership", "--db", "{db}", "--max-rows", "-1"], "--max-rows: expected an integer of at least 0, not -1"),
    (["sql", "--db", "{db}", "-- a comment"], "no rows to show"),
    (["query", "membership", "--db", "{db}", "--format", "csv", "--out", "{db}"], "is the database itself"),
])
def test_bad_input_gets_one_line_and_status_2(capsys, run_only_db, capture_only_db, tmp_path, argv, message):
    notdb = tmp_path / "notes.txt"
    notdb.write_text("not a database\n")
    argv = [a.format(db=run_only_db, capture=capture_only_db, missing=tmp_path / "none.duckdb", notdb=notdb)
            for a in argv]
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("itertrace: error: "), err
    assert message in err, err


def test_generic_mapping_without_a_step_pattern_says_which_parameter_is_missing(capsys, sample_dbs):
    rc, _, err = _run(capsys, "query", "host_gaps", "--db", str(sample_dbs["static"]), "--param", "preset=generic")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "parameter step_pattern is missing" in err


def test_an_empty_result_from_a_mapping_that_matches_nothing_says_why(capsys, sample_dbs):
    db = str(sample_dbs["static"])
    rc, out, err = _run(capsys, "query", "host_gaps", "--db", db, "--param", "preset=generic",
                        "--param", r"step_pattern=^decode_step_\d+$")
    assert rc == 0 and "(no rows)" in out
    assert err == ("itertrace: note: the mapping matches no step range in nvtx_ranges: check step_pattern and domain "
                   "(`SELECT * FROM mapping` shows them; docs/queries.md lists the parameters)\n")
    rc, out, err = _run(capsys, "query", "host_gaps", "--db", db, "--param", "preset=generic",
                        "--param", "step_pattern=^step$")  # steps found, but on a CPU trace no device_pattern
    assert rc == 0 and "(no rows)" in out and "step ranges has a device interval" in err
    rc, out, err = _run(capsys, "query", "host_gaps", "--db", db)  # this engine's names: rows, and which auto chose
    assert rc == 0 and "(no rows)" not in out
    assert err == ("itertrace: note: mapping: auto chose this engine's `step` ranges: 544 step ranges named 'step' "
                   "(the same explicitly: --param preset=itertrace)\n")


def test_a_failed_install_writes_nothing(capsys, run_only_db, tmp_path):
    db = tmp_path / "copy.duckdb"
    shutil.copy(run_only_db, db)
    before = db.read_bytes()
    for param in ("repeat_threshold=x", "step_pattern=(("):
        rc, _, err = _run(capsys, "query", "--install", "--db", str(db), "--param", param)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "parameter" in err
        assert db.read_bytes() == before
    other = tmp_path / "other.duckdb"  # a DuckDB file that itertrace did not make
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    rc, _, err = _run(capsys, "query", "--install", "--db", str(other))
    assert rc == 2 and err.count("\n") == 1 and f"{other}: no table of `itertrace ingest`" in err
    with duckdb.connect(str(other), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone() == (0,)


def test_a_failed_write_leaves_no_file(capsys, run_only_db, tmp_path):
    target = tmp_path / "out.csv"
    rc, _, err = _run(capsys, "sql", "--db", str(run_only_db), "--format", "csv", "--out", str(target),
                      "SELECT error('boom') FROM membership")
    assert rc == 2 and "boom" in err
    assert list(tmp_path.glob("out.csv*")) == [] and list(tmp_path.glob(".out.csv*")) == []
