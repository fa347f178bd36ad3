"""What `itertrace sql` may reach: its database, read-only, and the one file --out names. No other file read
or written, no extension installed or loaded (so no network), no setting undone; a parameter given once.
And what it holds in memory: the rows it shows, not the rows a statement makes."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from itertrace.queries.output import format_table


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("contract")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--capacity", "8", "--out", str(folder / "run")]) == 0
    assert main(["ingest", str(folder / "run"), "--db", str(folder / "run.duckdb"), "--quiet"]) == 0
    return folder / "run.duckdb"


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: ") and captured.out == "", captured.err
    return lines[0]


@pytest.mark.parametrize("statement, made", [
    ("COPY (SELECT 1) TO '{tmp}/copied.csv'", "copied.csv"),
    ("EXPORT DATABASE '{tmp}/exported'", "exported"),
    ("ATTACH '{tmp}/attached.duckdb' AS other", "attached.duckdb"),
    ("SELECT * FROM read_csv('/etc/passwd')", None),
    ("SELECT * FROM read_text('/etc/hostname')", None),
    ("SELECT * FROM glob('/etc/*')", None),
    ("SELECT * FROM '{tmp}/rows.parquet'", None),
    ("INSTALL httpfs", None),
    ("LOAD httpfs", None),
    ("SELECT * FROM 'https://example.com/rows.parquet'", None),
    ("SET enable_external_access = true", None),
    ("SET autoinstall_known_extensions = true", None),
])
def test_sql_reads_its_database_only_and_writes_nothing(statement, made, db, tmp_path, capsys):
    pq.write_table(pq.read_table(io.BytesIO(_parquet_bytes())), tmp_path / "rows.parquet")
    before = sorted(p.name for p in tmp_path.iterdir())
    line = refused(capsys, "sql", "--db", str(db), statement.format(tmp=tmp_path, db=db))
    assert "read only their database and write only the file --out names" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before and (made is None or not (tmp_path / made).exists())


def _parquet_bytes() -> bytes:
    import pyarrow as pa

    sink = io.BytesIO()
    pq.write_table(pa.table({"x": [1, 2]}), sink)
    return sink.getvalue()


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet", "table"])
def test_the_views_and_out_still_work_under_the_contract(fmt, db, tmp_path, capsys):
    out = tmp_path / f"rows.{fmt}"
    assert main(["sql", "--db", str(db), "SELECT iteration, limit_reason FROM membership_iterations ORDER BY iteration",
                 "--format", fmt, "--out", str(out)]) == 0
    import duckdb
    with duckdb.connect(str(db), read_only=True) as con:
        n = con.execute("SELECT count(*) FROM run_iterations").fetchone()[0]
    assert n > 100 and capsys.readouterr().err.strip() == f"itertrace: wrote {n} rows to {out}"
    if fmt == "parquet":
        assert pq.read_table(out).num_rows == n
    elif fmt == "json":
        assert len(json.loads(out.read_text())) == n
    else:
        assert len(out.read_text().splitlines()) == n + 1 + (fmt == "table")


def test_a_text_table_written_to_a_file_is_the_table_shown_whole(db, tmp_path, capsys):
    """The file streams through a spilled copy; the terminal's table holds every row in memory: the same text."""
    sql = "SELECT iteration, limit_reason, finished, ran, 1.5 * iteration AS x FROM membership_iterations ORDER BY iteration"
    out = tmp_path / "rows.txt"
    assert main(["sql", "--db", str(db), sql, "--out", str(out)]) == 0
    assert main(["sql", "--db", str(db), sql, "--max-rows", "100000"]) == 0
    shown = capsys.readouterr().out
    assert out.read_text() == shown and len(shown.splitlines()) > 100
    import duckdb
    with duckdb.connect(str(db), read_only=True) as con:
        from itertrace.queries.library import install
        install(con)
        rel = con.sql(sql)
        assert shown == format_table(rel.columns, rel.fetchall(), None)


def test_a_parameter_given_twice_is_refused(db, capsys):
    line = refused(capsys, "query", "membership_iterations", "--db", str(db), "--param", "preset=generic",
                   "--param", "preset=itertrace")
    assert "--param preset: given twice ('generic', then 'itertrace')" in line


def test_a_statement_that_is_not_utf8_is_refused(db, capsys):
    statement = b"SELECT '\xff'".decode("utf-8", "surrogateescape")  # as Python hands over such an argument
    assert "not valid UTF-8 (byte 0xff at character 9)" in refused(capsys, "sql", "--db", str(db), statement)


# The peak resident memory of this process since its exec (VmHWM; ru_maxrss would count the parent's memory
# too, which a vfork'ed child shares until it execs).
MEASURE = """
import re, sys
from pathlib import Path
from itertrace.cli import main
status = main(sys.argv[1:])
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) // 1024, file=sys.stderr)
sys.exit(status)
"""


@pytest.mark.slow
def test_sql_holds_only_the_rows_it_shows(db):
    """30 million rows made, 40 shown: the command's peak memory is that of the command, not of the rows
    (fetching every row took 2.96 GB)."""
    done = subprocess.run([sys.executable, "-c", MEASURE, "sql", "--db", str(db), "SELECT * FROM range(30000000)"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 + 40 + 1 and lines[-1].startswith("... over 100,000 more rows"), lines[-3:]
    assert [int(v) for v in lines[2:42]] == list(range(40))
    peak_mb = int(done.stderr.strip().splitlines()[-1])
    assert peak_mb < 400, peak_mb
