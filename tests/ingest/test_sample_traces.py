"""sample_traces/: each committed capture ingests with its run directory, and its steps are the run's iterations."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from itertrace.ingest import ingest
from itertrace.profiler.tracing.nvtx_ranges import PHASES

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
NAMES = ("worked-example-static", "worked-example-continuous")
needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys (Nsight Systems) is not installed")


def test_samples_hold_a_report_and_a_complete_run_directory():
    for name in NAMES:
        folder = SAMPLES / name
        assert (folder / "report.nsys-rep").is_file(), folder
        assert sorted(p.name for p in (folder / "run").iterdir()) == [
            "events.parquet", "iterations.parquet", "requests.parquet", "run.json"]
        meta = json.loads((folder / "run" / "run.json").read_text())
        assert (meta["runner"], meta["device"], meta["workload"]) == ("torch", "cpu", "worked-example")
        assert meta["config"]["scheduler"]["mode"] == name.rsplit("-", 1)[1]
    assert sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file()) < 5_000_000  # a few MB in all


@pytest.mark.nsys
@needs_nsys
@pytest.mark.parametrize("name", NAMES)
def test_sample_ingests_and_its_steps_are_the_runs_iterations(name, tmp_path):
    folder = SAMPLES / name
    db = tmp_path / f"{name}.duckdb"
    result = ingest([folder / "run", folder / "report.nsys-rep"], db)
    assert result.kinds == ("run", "nsys")
    with duckdb.connect(str(db), read_only=True) as con:
        mode, iterations = con.execute("SELECT mode, iterations FROM run_meta").fetchone()
        assert mode == name.rsplit("-", 1)[1]
        # One to one: every logged iteration has exactly one step range carrying its number, and no
        # step range carries a number the log lacks.
        matched = con.execute("""
            WITH step AS (SELECT range_id, int64_value AS iteration FROM nvtx_ranges
                          WHERE domain_name = 'itertrace' AND text = 'step')
            SELECT count(i.iteration), count(s.range_id),
                   count(*) FILTER (WHERE i.iteration IS NULL OR s.range_id IS NULL)
            FROM run_iterations i FULL JOIN step s USING (iteration)""").fetchone()
        assert matched == (iterations, iterations, 0)
        duplicated = con.execute("""SELECT count(*) FROM (SELECT int64_value FROM nvtx_ranges WHERE text = 'step'
                                    GROUP BY 1 HAVING count(*) > 1)""").fetchone()
        assert duplicated == (0,)
        names = ", ".join(f"'{p}'" for p in PHASES)
        phases = con.execute(f"""
            SELECT count(*) FROM nvtx_ranges c JOIN nvtx_ranges s ON c.parent_range_id = s.range_id
            WHERE s.text = 'step' AND c.text IN ({names})""").fetchone()
        assert phases == (len(PHASES) * iterations,)
        marks = con.execute("""SELECT text, count(DISTINCT int64_value) FROM nvtx_marks
                               WHERE domain_name = 'itertrace' GROUP BY 1 ORDER BY 1""").fetchall()
        requests = con.execute("SELECT count(*) FROM run_requests").fetchone()[0]
        assert [m for m in marks if not m[0].startswith("tokens")] == [
            ("admit", requests), ("arrive", requests), ("finish", requests)]


@pytest.mark.nsys
@needs_nsys
def test_ingesting_a_sample_twice_gives_identical_tables(tmp_path):
    folder = SAMPLES / "worked-example-continuous"
    dumps = []
    for name in ("a.duckdb", "b.duckdb"):
        ingest([folder / "report.nsys-rep", folder / "run"], tmp_path / name)
        with duckdb.connect(str(tmp_path / name), read_only=True) as con:
            tables = con.execute("SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
            dumps.append({f"{s}.{t}": con.execute(f'SELECT * FROM "{s}"."{t}"').fetchall() for s, t in tables})
            views = con.execute("SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal ORDER BY ALL").fetchall()
            dumps[-1] |= {f"{s}.{v}": con.execute(f'SELECT * FROM "{s}"."{v}" ORDER BY ALL').fetchall() for s, v in views}
    assert dumps[0] == dumps[1]
    assert {"main.run_iterations", "main.run_meta", "main.nvtx_ranges", "nsys.NVTX_EVENTS"} <= set(dumps[0])
