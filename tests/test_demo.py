"""`itertrace demo`, the README's main command, end to end at a small size."""
from __future__ import annotations

import shutil

import pytest

from itertrace.cli import main
from itertrace.errors import UserError


@pytest.mark.slow
def test_demo_writes_four_reports_and_prints_the_headlines(tmp_path, capsys):
    out = tmp_path / "demo"
    profiled = shutil.which("nsys") is not None
    assert main(["demo", "--out", str(out), "--requests", "64"] + ([] if profiled else ["--no-profile"])) == 0
    text = capsys.readouterr().out
    for heading in ("== worked example (simulated) ==", "== stranded slot-time (simulated) ==",
                    "== fairness (simulated) ==", "== live torch run", "== overlap off and on (torch runner",
                    "== overlap off and on (simulated: the mechanism"):
        assert heading in text
    # each overlap table splits its change in wall time; the simulated one hides host time and nothing else
    assert text.count("so wall change = device change - host hidden") == 2
    assert f"report: {(out / 'report.html').resolve()}" in text
    for name in ("report.html", "slot-time.html", "fairness.html", "overlap.html"):
        page = (out / name).read_text()
        assert "<script" in page and "https://cdn" not in page and "vega" in page
    assert sorted(p.name for p in (out / "db").iterdir()) == sorted(
        [f"worked-example-{m}.duckdb" for m in ("static", "continuous")]
        + [f"slot-time-{w}-{m}.duckdb" for w in ("uniform", "variable") for m in ("static", "continuous")]
        + [f"fairness-{p}.duckdb" for p in ("fcfs", "srw", "priority", "priority-no-aging")])
    if profiled:
        assert (out / "live" / "report.nsys-rep").is_file()
        assert "host gaps:" in text and "latency rebuilt from the trace alone agrees" in text
        assert "figures from the nsys capture" in text and 'id="overlap"' in (out / "overlap.html").read_text()
    # a second demo into the same folder replaces the first
    assert main(["demo", "--out", str(out), "--requests", "16", "--no-profile"]) == 0
    assert (out / "report.html").is_file() and sorted(p.name for p in out.parent.iterdir()) == [out.name]


def test_demo_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "is not an earlier demo's folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert main(["demo", "--out", str(tmp_path / "mine.txt")]) == 2  # a file, not a folder
    assert "is not an earlier demo's folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_a_failed_demo_puts_the_earlier_one_back(tmp_path, capsys, monkeypatch):
    from itertrace.profiler import experiments

    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.html").write_text("the earlier demo's report")

    def fails(*args, **kwargs):
        raise UserError("the worked example failed")
    monkeypatch.setattr(experiments, "worked_example", fails)
    assert main(["demo", "--out", str(out), "--no-profile"]) == 2
    assert "the worked example failed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    assert [p.name for p in out.iterdir()] == ["report.html"]
    assert (out / "report.html").read_text() == "the earlier demo's report"
