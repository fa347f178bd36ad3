"""Answers the ingest stores (queries.stored): the rows served are the rows computed, and never stale."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from itertrace.cli import main
from itertrace.errors import UserError
from itertrace.ingest import ingest
from itertrace.queries import QueryDB, catalog
from itertrace.queries import stored
from itertrace.queries.stored import RESULTS, STORED, lookup, stored_choice, storing
from itertrace.queries.suggest import CHOOSING, choose_mapping

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
SAMPLES = {p.name: [p] for p in sorted((SHARED / "serving_traces").glob("*.json.gz"))}
SAMPLES |= {p.name: [p] for p in sorted((SHARED / "kineto_samples").glob("*.json.gz"))}
SAMPLES |= {p.name: [p] for p in sorted((SHARED / "nsys_samples").glob("*_pqtdir"))}
SAMPLES |= {f.name: [f / "run", f / "report.nsys-rep"] for f in sorted((ROOT / "sample_traces").glob("worked-example-*"))}
VLLM = SHARED / "serving_traces" / "vllm_decode_full_graph_step.json.gz"
needs_vllm = pytest.mark.skipif(not VLLM.is_file(), reason=f"the real vLLM trace is not at {VLLM}")


def _stored_db(sources: list[Path], db: Path) -> Path:
    ingest(sources, db, finish=storing("always"))
    return db


@pytest.fixture(scope="module")
def vllm_db(tmp_path_factory) -> Path:
    if not VLLM.is_file():
        pytest.skip(f"the real vLLM trace is not at {VLLM}")
    return _stored_db([VLLM], tmp_path_factory.mktemp("stored") / "vllm.duckdb")


def _computed(db: Path, name: str, params: dict[str, str] | None = None) -> list[tuple]:
    with QueryDB(db, params) as queried:
        return queried.rows(f"SELECT * FROM {name}")


def _cli_rows(db: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "itertrace.cli", "query", "gpu_time_summary", "--db", str(db),
                           "--format", "csv", *args], capture_output=True, text=True)


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_stored_rows_are_the_rows_computed(sample, tmp_path):
    sources = SAMPLES[sample]
    if sample.startswith("worked-example") and shutil.which("nsys") is None:
        pytest.skip("nsys (Nsight Systems) is not installed: the sample report cannot be exported")
    db = _stored_db(sources, tmp_path / "db.duckdb")
    with QueryDB(db) as queried:  # the mapping auto chose at ingest is the one it chooses now, variables and all
        stored_choice_ = stored_choice(queried.session, {})
        assert (stored_choice_ is None) == ("nvtx_ranges" in queried.lacking)
        if stored_choice_ is not None:
            queried.need(CHOOSING)
            assert choose_mapping(queried.session, {}) == stored_choice_
            assert queried.mapping_choice == stored_choice_
    for name in STORED:
        with QueryDB(db) as queried:
            found = queried.stored(name)
            if found is None:  # stored only where there is an answer: a capture without GPU work has none
                with pytest.raises(UserError, match="no GPU work in this capture"):
                    queried.rows(f"SELECT * FROM {name}")
                continue
            stored = queried.rows(found.statement)
            computed = queried.rows(f"SELECT * FROM {name}")  # the view itself: computed here, now
            assert stored == computed and computed  # the same rows in the same order, types and all
            assert queried.query(name).to_pylist() == queried.sql(f"SELECT * FROM {name}").to_pylist()


@needs_vllm
def test_the_command_prints_the_same_rows_and_note_stored_or_not(vllm_db, tmp_path):
    plain = tmp_path / "plain.duckdb"
    ingest([VLLM], plain)  # no answer stored: the command computes it
    with duckdb.connect(str(plain), read_only=True) as con:
        assert not con.execute("SELECT * FROM duckdb_tables() WHERE table_name LIKE '_stored%'").fetchall()
    served, computed = _cli_rows(vllm_db), _cli_rows(plain)
    assert served.returncode == computed.returncode == 0, served.stderr + computed.stderr
    assert served.stdout == computed.stdout and served.stdout.count("\n") == 2
    assert served.stderr == computed.stderr and "mapping: auto chose the vllm preset" in served.stderr


@needs_vllm
def test_a_parameter_or_another_mapping_computes(vllm_db):
    with QueryDB(vllm_db) as queried:
        assert queried.stored("gpu_time_summary") is not None
    for params in ({"preset": "vllm"}, {"preset": "generic", "step_pattern": "^execute_"}, {"device_pattern": "x"}):
        with QueryDB(vllm_db, params) as queried:
            assert queried.stored("gpu_time_summary") is None
    # a mapping that maps nothing: the command computes, so its rows are not the stored ones
    changed = _cli_rows(vllm_db, "--param", "preset=generic", "--param", "step_pattern=^no such range$")
    assert changed.returncode == 0 and changed.stdout != _cli_rows(vllm_db).stdout


@needs_vllm
def test_changed_sql_computes(vllm_db, tmp_path, monkeypatch):
    sql = tmp_path / "queries"
    shutil.copytree(catalog.SQL_DIR, sql, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(catalog, "SQL_DIR", sql)
    with duckdb.connect(str(vllm_db), read_only=True) as con:
        assert lookup(con, "gpu_time_summary", {}) is not None  # the same SQL, elsewhere: still the answer
        text = (sql / "gpu_time.sql").read_text()
        (sql / "gpu_time.sql").write_text(text.replace("-- ", "--  ", 1))  # one character of a module it reads
        assert lookup(con, "gpu_time_summary", {}) is None
        (sql / "gpu_time.sql").write_text(text)
        (sql / "fairness.sql").write_text((sql / "fairness.sql").read_text() + "\n")  # a module it does not read
        assert lookup(con, "gpu_time_summary", {}) is not None
        (sql / "gpu_time.sql").unlink()
        assert lookup(con, "gpu_time_summary", {}) is None


@needs_vllm
def test_changed_rows_or_an_older_ingest_compute(vllm_db, tmp_path):
    changed = tmp_path / "changed.duckdb"
    shutil.copy(vllm_db, changed)
    with duckdb.connect(str(changed)) as con:
        con.execute("INSERT INTO _gpu_op_rows SELECT * FROM _gpu_op_rows LIMIT 1")  # the table under the view
        assert lookup(con, "gpu_time_summary", {}) is None
    older = tmp_path / "older.duckdb"
    shutil.copy(vllm_db, older)
    with duckdb.connect(str(older)) as con:
        con.execute(f"DROP TABLE {RESULTS}")
        assert lookup(con, "gpu_time_summary", {}) is None
    expected = _cli_rows(vllm_db).stdout
    assert _cli_rows(older).stdout == expected
    for name in ("iterations", "host_gaps_summary", "mapping"):  # the mapping chosen at ingest, or chosen now
        assert _computed(vllm_db, name) == _computed(older, name)


@needs_vllm
def test_changed_presets_choose_again(vllm_db, tmp_path, monkeypatch):
    with duckdb.connect(str(vllm_db), read_only=True) as con:
        assert stored_choice(con, {}) is not None and stored_choice(con, {"preset": "auto"}) is None
        presets = tmp_path / "presets.toml"
        presets.write_text(stored.PRESETS_FILE.read_text() + "\n")
        monkeypatch.setattr(stored, "_CODE", [presets if p == stored.PRESETS_FILE else p for p in stored._CODE])
        assert stored_choice(con, {}) is None and lookup(con, "gpu_time_summary", {}) is None


@needs_vllm
def test_a_read_only_file_and_two_commands_at_once(vllm_db, tmp_path):
    db = tmp_path / "ro.duckdb"
    shutil.copy(vllm_db, db)
    db.chmod(0o444)
    expected = _cli_rows(vllm_db).stdout
    # another process holds the database open (read-only, as every query does) while two commands read it
    holder = subprocess.Popen([sys.executable, "-c", "import sys, duckdb; c = duckdb.connect(sys.argv[1], "
                               "read_only=True); print('open', flush=True); sys.stdin.read()", str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"  # the file is held from here on
        both = [subprocess.Popen([sys.executable, "-m", "itertrace.cli", "query", "gpu_time_summary", "--db", str(db),
                                  "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
        outs = [p.communicate() for p in both]
        assert [p.returncode for p in both] == [0, 0], outs
        assert [out for out, _ in outs] == [expected, expected]
    finally:
        holder.communicate("")
    assert holder.returncode == 0


@needs_vllm
def test_install_over_a_stored_database(vllm_db, tmp_path):
    db = tmp_path / "installed.duckdb"
    shutil.copy(vllm_db, db)
    expected = _cli_rows(db).stdout
    assert main(["query", "--install", "--db", str(db)]) == 0
    assert _cli_rows(db).stdout == expected
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM gpu_time_summary").fetchone()[0] == expected.count("\n") - 1


def test_the_store_option(tmp_path):
    if not VLLM.is_file():
        pytest.skip(f"the real vLLM trace is not at {VLLM}")
    for mode, stored in (("never", False), ("auto", True), ("always", True)):
        db = tmp_path / f"{mode}.duckdb"
        assert main(["ingest", str(VLLM), "--db", str(db), "--quiet", "--store", mode]) == 0
        with duckdb.connect(str(db), read_only=True) as con:
            assert bool(lookup(con, "gpu_time_summary", {})) is stored
    assert storing("auto")(None, tmp_path, 10**9) == ()  # over STORE_AUTO_ROWS: nothing computed
