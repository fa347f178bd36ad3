"""`itertrace fleet` and `report --fleet` on bad input: one line naming what is wrong, status 2, nothing written,
and no cluster started (each refusal comes before one)."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from fleet_captures import kineto_rank

from itertrace.cli import main

SAMPLE = Path(__file__).parents[2] / ".." / "shared" / "kineto_samples" / "tiny_inference_rank1.json.gz"


def refused(capsys, *argv: str) -> str:
    """The one line a refused command prints."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("itertrace: error: ")
    return err.strip()


def test_an_empty_folder(tmp_path, capsys):
    (tmp_path / "captures").mkdir()
    line = refused(capsys, "fleet", "ingest", str(tmp_path / "captures"), "--out", str(tmp_path / "fleet"))
    assert "captures: empty folder: no captures in it" in line
    assert not (tmp_path / "fleet").exists()


def test_a_folder_of_non_captures(tmp_path, capsys):
    folder = tmp_path / "notes"
    (folder / "deeper").mkdir(parents=True)
    (folder / "readme.txt").write_text("not a trace\n")
    (folder / "deeper" / "rows.csv").write_text("a,b\n1,2\n")
    line = refused(capsys, "fleet", "ingest", str(folder), "--out", str(tmp_path / "fleet"))
    assert "notes: no captures in this folder (2 files, none a trace); expected a PyTorch profiler trace" in line
    assert not (tmp_path / "fleet").exists()


def test_a_scheduler_nobody_answers_at(tmp_path, capsys):
    kineto_rank(tmp_path / "in" / "rank-0.json.gz", 0, 1, {1: 1000})
    with socket.socket() as held:  # bound, never listening: a connection to it is refused, and no one else gets it
        held.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        for argv in (["fleet", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "fleet")],
                     ["fleet", "summary", str(tmp_path / "fleet")]):
            line = refused(capsys, *argv, "--scheduler", address)
            assert f"--scheduler {address}: nobody answers there (Connection refused)" in line
    assert not (tmp_path / "fleet").exists()


@pytest.mark.parametrize("address", ["nonsense", "http://host:80", "tcp://host", "tcp://:8786"])
def test_a_scheduler_address_that_is_none(tmp_path, capsys, address):
    kineto_rank(tmp_path / "in" / "rank-0.json.gz", 0, 1, {1: 1000})
    line = refused(capsys, "fleet", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "fleet"),
                   "--scheduler", address)
    assert f"--scheduler {address}: not a scheduler address; expected tcp://HOST:PORT" in line


def test_an_out_folder_that_is_not_a_fleet(tmp_path, capsys):
    kineto_rank(tmp_path / "in" / "rank-0.json.gz", 0, 1, {1: 1000})
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("...")
    (tmp_path / "file").write_text("x")
    line = refused(capsys, "fleet", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "busy"))
    assert "holds files that are not a fleet's (no captures.parquet)" in line
    assert refused(capsys, "fleet", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "file")).endswith(
        "is a file; --out names the fleet's folder")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["thesis.tex"]


@pytest.mark.parametrize("pattern, why", [
    ("rank-\\d+", "needs exactly one capturing group, the rank; it has 0"),
    ("(rank)-(\\d+)", "needs exactly one capturing group, the rank; it has 2"),
    ("rank-(\\d+", "not a regular expression"),
    ("(in)/", "matched 'in' in "),
])
def test_a_rank_pattern_that_cannot_give_ranks(tmp_path, capsys, pattern, why):
    kineto_rank(tmp_path / "in" / "rank-0.json.gz", 0, 1, {1: 1000})
    line = refused(capsys, "fleet", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "fleet"),
                   "--rank-from", pattern)
    assert why in line
    assert not (tmp_path / "fleet").exists()


def test_two_captures_of_one_name(tmp_path, capsys):
    for node in ("a", "b"):
        kineto_rank(tmp_path / node / "server" / "rank-0.json.gz", 0, 1, {1: 1000})
    line = refused(capsys, "fleet", "ingest", str(tmp_path / "a" / "server"), str(tmp_path / "b" / "server"),
                   "--out", str(tmp_path / "fleet"))
    assert "two captures are named server/rank-0.json.gz" in line


def test_a_run_directory_alone_and_a_missing_path(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    assert "a run directory, not a capture" in refused(capsys, "fleet", "ingest", str(run), "--out",
                                                       str(tmp_path / "fleet"))
    assert refused(capsys, "fleet", "ingest", str(tmp_path / "gone"), "--out", str(tmp_path / "fleet")).endswith(
        "gone: no such file or folder")


def test_summary_and_report_of_what_is_no_fleet(tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    assert "no such fleet folder" in refused(capsys, "fleet", "summary", str(tmp_path / "none"))
    assert "not a fleet (no captures.parquet" in refused(capsys, "fleet", "summary", str(tmp_path / "plain"))
    assert "not a fleet (no captures.parquet" in refused(capsys, "report", "--fleet", str(tmp_path / "plain"),
                                                         "-o", str(tmp_path / "page.html"))
    assert "give --db FILE (a run's database), or --fleet FLEET" in refused(capsys, "report", "-o",
                                                                            str(tmp_path / "page.html"))
    assert not (tmp_path / "page.html").exists()


@pytest.mark.shared
@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared Kineto samples not found at {SAMPLE.resolve()}")
def test_one_capture_given_twice(tmp_path, capsys):
    shutil.copy(SAMPLE, tmp_path / "rank1.json.gz")
    assert refused(capsys, "fleet", "ingest", str(tmp_path / "rank1.json.gz"), str(tmp_path / "rank1.json.gz"),
                   "--out", str(tmp_path / "fleet")).endswith("rank1.json.gz: given twice")


def test_the_parser_imports_no_dask():
    import subprocess
    import sys

    code = ("import sys; from itertrace.cli import build_parser; build_parser(); "
            "print(','.join(m for m in ('dask', 'distributed', 'duckdb', 'pyarrow') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == ""
