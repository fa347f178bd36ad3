"""What a fleet's paths say: captures found and named, run directories paired, ranks and groups read from paths;
what a second run redoes; failures of the summary; the progress line. The tasks run in this process here
(no client): the Dask runs are in test_fleet_ranks.py, test_fleet_processes.py and test_fleet_interrupt.py."""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from fleet_captures import kineto_rank
from profiled_run import profiled_run

from itertrace.cli import main
from itertrace.fleet import Fleet, PathRules, find_captures, ingest_fleet, new_or_existing, summarize_fleet
from itertrace.fleet.runner import TaskProgress

STEPS = {i: 1_000 + 100 * i for i in range(4)}


def names(captures) -> list[str]:
    return [c.name for c in captures]


def test_captures_are_named_by_their_path_and_exports_are_not_entered(tmp_path):
    root = tmp_path / "nightly"
    kineto_rank(root / "b" / "rank-1.json.gz", 1, 2, STEPS)
    kineto_rank(root / "a" / "deep" / "rank-0.json.gz", 0, 2, STEPS)
    export = root / "c" / "node_pqtdir"
    export.mkdir(parents=True)
    (root / "c" / "notes.txt").write_text("not a capture")
    (export / "NVTX_EVENTS.parquet").write_bytes(b"")
    (export / "inner.json").write_text("{}")  # inside an export: not a capture of its own
    (root / ".hidden.json").write_text("{}")
    single = kineto_rank(tmp_path / "alone.json.gz", 0, None, STEPS)
    found = find_captures([root, single])
    assert names(found) == ["nightly/a/deep/rank-0.json.gz", "nightly/b/rank-1.json.gz", "nightly/c/node_pqtdir",
                            "alone.json.gz"]
    assert [c.source for c in found] == [root / "a" / "deep" / "rank-0.json.gz", root / "b" / "rank-1.json.gz",
                                         export, single]
    assert names(find_captures([root], skip=root / "b")) == ["nightly/a/deep/rank-0.json.gz", "nightly/c/node_pqtdir"]


def test_a_capture_goes_in_with_the_run_directory_beside_it(tmp_path_factory, tmp_path):
    made = profiled_run(tmp_path_factory)
    folder = tmp_path / "runs" / "one"
    shutil.copytree(made.run_dir, folder / "run")
    shutil.copy(made.trace, folder / "trace.json.gz")
    kineto_rank(tmp_path / "runs" / "two" / "a.json.gz", 0, 2, STEPS)  # two captures and a run: no pairing
    kineto_rank(tmp_path / "runs" / "two" / "b.json.gz", 1, 2, STEPS)
    shutil.copytree(made.run_dir, tmp_path / "runs" / "two" / "run")
    found = {c.name: c for c in find_captures([tmp_path / "runs"])}
    assert found["runs/one/trace.json.gz"].run_dir == folder / "run"
    assert found["runs/one/trace.json.gz"].sources == (folder / "run", folder / "trace.json.gz")
    assert found["runs/two/a.json.gz"].run_dir is None and found["runs/two/b.json.gz"].run_dir is None
    fleet = new_or_existing(tmp_path / "fleet")
    assert ingest_fleet([found["runs/one/trace.json.gz"]], fleet, None).ingested == 1
    with duckdb.connect(str(fleet.database("runs/one/trace.json.gz")), read_only=True) as con:
        logged, traced = con.execute("SELECT (SELECT count(*) FROM run_iterations), "
                                     "(SELECT count(*) FROM nvtx_ranges WHERE text = 'step')").fetchone()
    assert logged == traced > 0


def test_ranks_and_groups_from_the_path(tmp_path):
    for job in ("job-7", "job-8"):
        for r in range(2):
            kineto_rank(tmp_path / "in" / f"{job}-worker{r}" / "trace.json.gz", r, None,
                        {i: 1_000 + (500 if (job, r, i) == ("job-7", 1, 2) else 0) for i in range(4)})
    rules = PathRules(rank_from=r"worker(\d+)/", group_from=r"/(job-\d+)-")
    rules.check()
    fleet = new_or_existing(tmp_path / "fleet")
    ingest_fleet(find_captures([tmp_path / "in"]), fleet, None, rules=rules)
    summarize_fleet(fleet, None)
    with duckdb.connect(str(fleet.summary / "fleet.duckdb"), read_only=True) as con:
        assert con.execute("SELECT DISTINCT capture, rank, rank_source, \"group\" FROM fleet_ranks ORDER BY 1"
                           ).fetchall() == [(f"in/{j}-worker{r}/trace.json.gz", r, "path", j)
                                            for j in ("job-7", "job-8") for r in range(2)]
        assert con.execute("SELECT \"group\", iteration, skew_ns, straggler_rank FROM fleet_skew WHERE skew_ns > 0"
                           ).fetchall() == [("job-7", 2, 500_000, 1)]
        assert con.execute("SELECT \"group\", ranks, iterations FROM fleet_groups").fetchall() == [
            ("job-7", 2, 4), ("job-8", 2, 4)]


def test_a_second_run_redoes_only_what_changed_or_failed(tmp_path):
    first = kineto_rank(tmp_path / "in" / "rank-0.json.gz", 0, 2, STEPS)
    kineto_rank(tmp_path / "in" / "rank-1.json.gz", 1, 2, STEPS)
    broken = tmp_path / "in" / "rank-2.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08 not really")
    fleet = new_or_existing(tmp_path / "fleet")
    result = ingest_fleet(find_captures([tmp_path / "in"]), fleet, None)
    assert (result.ingested, result.skipped, result.failed) == (2, 0, 1)
    os.utime(first, (first.stat().st_atime, fleet.database("in/rank-0.json.gz").stat().st_mtime + 10))  # newer
    result = ingest_fleet(find_captures([tmp_path / "in"]), fleet, None)
    assert (result.ingested, result.skipped, result.failed) == (1, 1, 1)
    manifest = {r["capture"]: r for r in pq.read_table(fleet.manifest).to_pylist()}
    assert [(n, r["status"]) for n, r in sorted(manifest.items())] == [
        ("in/rank-0.json.gz", "done"), ("in/rank-1.json.gz", "done"), ("in/rank-2.json.gz", "failed")]
    assert manifest["in/rank-0.json.gz"]["ingest_s"] > 0 and manifest["in/rank-1.json.gz"]["ingest_s"] > 0
    assert manifest["in/rank-2.json.gz"]["error"].startswith(f"{broken}: ")
    assert pq.read_table(fleet.failures).to_pylist() == [
        {"capture": "in/rank-2.json.gz", "source": str(broken), "error": manifest["in/rank-2.json.gz"]["error"]}]


def test_a_capture_whose_queries_fail_is_a_failure_of_the_summary(tmp_path):
    for r in range(2):
        kineto_rank(tmp_path / "in" / f"rank-{r}.json.gz", r, 2, STEPS)
    fleet = new_or_existing(tmp_path / "fleet")
    ingest_fleet(find_captures([tmp_path / "in"]), fleet, None)
    fleet.database("in/rank-1.json.gz").write_bytes(b"no longer a database")
    result = summarize_fleet(fleet, None)
    assert (result.summarized, result.failed) == (1, 1)
    rows = pq.read_table(fleet.summary / "failures.parquet").to_pylist()
    assert [(r["capture"], r["stage"]) for r in rows] == [("in/rank-1.json.gz", "summary")]
    assert "not a DuckDB database" in rows[0]["error"]
    captures = pq.read_table(fleet.summary / "captures.parquet").to_pylist()
    assert [(c["capture"], c["status"]) for c in captures] == [("in/rank-0.json.gz", "done"),
                                                               ("in/rank-1.json.gz", "summary failed")]


def test_a_fleet_of_which_every_capture_fails(tmp_path, capsys):
    for r in range(2):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"rank-{r}.json").write_text("[not json")
    assert main(["fleet", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "fleet"), "--workers", "1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (f"itertrace: fleet ingest: all 2 captures failed ({tmp_path / 'fleet' / 'failures.parquet'} "
                       "lists each with its error)")
    assert main(["fleet", "summary", str(tmp_path / "fleet")]) == 2
    assert capsys.readouterr().err.strip().endswith("no capture of the fleet has a database (all 2 failed to ingest; "
                                                    f"{tmp_path / 'fleet' / 'failures.parquet'} says why)")


def test_one_command_at_a_time_holds_a_fleet(tmp_path, capsys):
    from itertrace.fleet.layout import held

    kineto_rank(tmp_path / "in" / "rank-0.json.gz", 0, 1, STEPS)
    fleet = new_or_existing(tmp_path / "fleet")
    ingest_fleet(find_captures([tmp_path / "in"]), fleet, None)
    with held(fleet):
        assert main(["fleet", "summary", str(fleet.root)]) == 2
    assert f"another fleet command is at work on it (PID {os.getpid()})" in capsys.readouterr().err


@pytest.mark.parametrize("tty", [False, True])
def test_the_progress_line_counts_done_failed_and_left(tty):
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    now = [0.0]
    stream = Stream()
    progress = TaskProgress("fleet ingest", 3, stream, interval_s=10.0, clock=lambda: now[0])
    progress.start()
    progress.count(failed=False)  # within the interval: not shown
    now[0] = 11.0
    progress.count(failed=True)
    progress.count(failed=False)  # the last: always shown
    progress.close()
    lines = ["fleet ingest: 0 done, 0 failed, 3 left", "fleet ingest: 1 done, 1 failed, 1 left",
             "fleet ingest: 2 done, 1 failed, 0 left"]
    if tty:
        assert stream.getvalue().split("\r")[1:-1] == lines + [" " * len(lines[-1])]
    else:
        assert stream.getvalue().splitlines() == lines


def test_the_fleet_is_a_fleet_of_its_own_folder(tmp_path):
    assert Fleet(tmp_path).database("a/b.json.gz") == tmp_path / "captures" / "a" / "b.json.gz.duckdb"
    assert Fleet(tmp_path).report("a/b.json.gz") == tmp_path / "reports" / "a" / "b.json.gz.html"


def test_the_fleet_page_links_each_capture_to_its_report(tmp_path, capsys):
    for r in range(2):
        kineto_rank(tmp_path / "in" / f"rank-{r}.json.gz", r, 2, STEPS)
    fleet = new_or_existing(tmp_path / "fleet")
    ingest_fleet(find_captures([tmp_path / "in"]), fleet, None)
    page = tmp_path / "fleet.html"
    assert main(["report", "--fleet", str(fleet.root), "-o", str(page)]) == 2
    assert "no summary yet; run `itertrace fleet summary" in capsys.readouterr().err
    summarize_fleet(fleet, None)
    assert main(["report", "--fleet", str(fleet.root), "-o", str(page), "--workers", "1"]) == 0
    assert ", 2 capture reports made in " in capsys.readouterr().err
    text = page.read_text()
    for r in range(2):
        report = fleet.report(f"in/rank-{r}.json.gz")
        assert report.read_text().startswith("<!DOCTYPE html>")
        assert f"<title>itertrace report: in/rank-{r}.json.gz</title>" in report.read_text()
        assert f'<a href="fleet/reports/in/rank-{r}.json.gz.html">report</a>' in text
    made = report.stat().st_mtime_ns
    assert main(["report", "--fleet", str(fleet.root), "-o", str(page), "--workers", "1"]) == 0
    assert "capture reports made" not in capsys.readouterr().err  # both there, newer than their databases
    assert report.stat().st_mtime_ns == made


def test_the_manual_names_every_column_and_the_readme_links_it():
    from itertrace.fleet.layout import MANIFEST_COLUMNS
    from itertrace.fleet.reduce import TABLES

    root = Path(__file__).parents[2]
    manual = (root / "docs" / "fleet.md").read_text()
    for table, (_, columns) in TABLES.items():
        assert f"`{table}`" in manual
        for column in columns:
            assert f"`{column}`" in manual, (table, column)
    for column in MANIFEST_COLUMNS:
        assert f"`{column}`" in manual, column
    assert "(docs/fleet.md)" in (root / "README.md").read_text()
