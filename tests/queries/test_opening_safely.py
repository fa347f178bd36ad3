"""Opening a database someone sent is as safe as opening a capture: its own views are SQL of its author's,
and none of them reads another file, whichever command opens it (`query`, `sql`, `mapping`, `report`,
`export`, a notebook's QueryDB). A view that reads a FIFO does not hang the command either."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from engine_captures import vllm
from itertrace.cli import main
from itertrace.errors import UserError

SECRET = "the-secret-only-the-owner-may-read"


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    """A database as `itertrace ingest` makes it, of a vLLM-shaped capture with GPU work."""
    folder = tmp_path_factory.mktemp("honest")
    db = folder / "trace.duckdb"
    vllm().capture.write(folder / "export")
    assert main(["ingest", str(folder / "export"), "--db", str(db), "--quiet"]) == 0
    return db


def crafted(honest: Path, folder: Path, read: Path) -> Path:
    """A copy of `honest` whose nvtx_ranges view puts the content of the file `read` in every range's text."""
    db = folder / "sent.duckdb"
    db.write_bytes(honest.read_bytes())
    with duckdb.connect(str(db)) as con:
        con.execute("ALTER VIEW nvtx_ranges RENAME TO _honest_ranges")
        con.execute("CREATE VIEW nvtx_ranges AS SELECT * REPLACE ((SELECT content FROM read_text('"
                    f"{read}')) AS text) FROM _honest_ranges")
        if read.is_file():
            assert SECRET in con.execute("SELECT any_value(text) FROM nvtx_ranges").fetchone()[0]  # it would read it
    return db


COMMANDS = {
    "query gpu_time_summary": lambda db, out: ["query", "gpu_time_summary", "--db", str(db)],
    "query iterations --out": lambda db, out: ["query", "iterations", "--db", str(db), "--format", "csv", "--out",
                                               str(out / "rows.csv")],
    "sql SELECT 1": lambda db, out: ["sql", "--db", str(db), "SELECT 1"],
    "sql over nvtx_ranges": lambda db, out: ["sql", "--db", str(db), "SELECT text FROM nvtx_ranges"],
    "mapping suggest": lambda db, out: ["mapping", "suggest", "--db", str(db)],
    "report": lambda db, out: ["report", "--db", str(db), "-o", str(out / "report.html")],
    "export perfetto": lambda db, out: ["export", "perfetto", "--db", str(db), "-o", str(out / "timeline.json")],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("source", ["file", "FIFO"])
def test_no_command_reads_a_file_through_the_databases_views(honest, tmp_path, command, source):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    db = crafted(honest, tmp_path, secret)
    if source == "FIFO":  # opened for reading, it would block until a writer comes: none does
        secret.unlink()
        os.mkfifo(secret)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "itertrace.cli", *COMMANDS[command](db, out)], capture_output=True,
                          text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("itertrace: error: "), done.stderr
    assert "disabled by configuration" in lines[0], lines[0]  # DuckDB's refusal, named in the one line
    assert SECRET not in done.stdout + done.stderr
    assert list(out.iterdir()) == []


def test_a_notebooks_querydb_reads_no_file_through_the_databases_views(honest, tmp_path):
    from itertrace.queries import QueryDB

    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    with pytest.raises(UserError) as refused:
        QueryDB(crafted(honest, tmp_path, secret))
    assert "nvtx_ranges is not as `itertrace ingest` makes it" in str(refused.value)
    assert "disabled by configuration" in str(refused.value) and SECRET not in str(refused.value)


def test_the_honest_database_answers_every_command(honest, tmp_path):
    """The lock-down takes nothing a command needs: the same commands succeed on the database as ingested."""
    for command, argv in COMMANDS.items():
        out = tmp_path / command.replace(" ", "_")
        out.mkdir()
        done = subprocess.run([sys.executable, "-m", "itertrace.cli", *argv(honest, out)], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr)


def test_sql_cannot_undo_the_lock_down(honest, tmp_path, capsys):
    elsewhere = tmp_path / "notes.txt"
    elsewhere.write_text("not the database")
    for statement, refused in [(f"SELECT * FROM read_text('{elsewhere}')", "disabled by configuration"),
                               (f"COPY (SELECT 1) TO '{tmp_path / 'copy.csv'}'", "disabled by configuration"),
                               ("SET enable_external_access = true", "configuration has been locked"),
                               ("SET memory_limit = '100GB'", "configuration has been locked")]:
        assert main(["sql", "--db", str(honest), statement]) == 2
        err = capsys.readouterr().err
        assert refused in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_sql_runs_under_a_memory_limit_and_says_which(honest, capsys):
    """A statement that would take the machine's memory stops at the limit, and the line names it."""
    from itertrace.queries.api import default_memory_limit

    assert main(["sql", "--db", str(honest), "SELECT current_setting('memory_limit') AS m", "--format", "csv"]) == 0
    shown = capsys.readouterr().out.splitlines()[1]
    default_mib = int(default_memory_limit().removesuffix("MiB"))
    assert shown == f"{default_mib / 1024:.1f} GiB" or shown == f"{default_mib:.1f} MiB", shown
    statement = "SELECT length(list(range)) FROM range(300000000)"  # about 2.4 GB as a list
    assert main(["sql", "--db", str(honest), statement, "--memory-limit", "256MB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ran out of memory under --memory-limit 256MB" in err[0], err
    assert main(["sql", "--db", str(honest), "SELECT 1", "--memory-limit", "lots"]) == 2
    assert "--memory-limit lots: not a size" in capsys.readouterr().err


def test_two_querydbs_of_one_file_share_the_lock_down(honest, tmp_path):
    """DuckDB gives connections to one file in one process one instance, its locked settings included: a
    second QueryDB works under the first's lock-down, and one that would write elsewhere is refused."""
    from itertrace.queries import QueryDB

    with QueryDB(honest) as first, QueryDB(honest, {"preset": "vllm"}) as second:
        assert first.query("iterations").num_rows == second.query("iterations").num_rows > 0
        with pytest.raises(UserError, match="already open in this process with other settings"):
            QueryDB(honest, writable=(tmp_path / "rows.csv",))
