"""`--overlap` on the engine's commands: a run, the experiments (their runs in overlap mode), calibrate refusing it."""
from __future__ import annotations

import json

from itertrace.cli import main


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_with_overlap_says_so_in_its_logs(tmp_path, capsys):
    out = tmp_path / "r"
    rc, text, _ = _run(capsys, "run", "--workload", "synthetic", "--num-requests", "12", "--output-len", "uniform:2:20",
                       "--overlap", "--out", str(out), "--format", "json")
    summary = json.loads(text)
    assert rc == 0 and summary["completed"] == 12 and summary["iterations_in_bulk"] == 0
    assert summary["tokens_dropped"] == 0  # length-only stops are known ahead: nothing is computed in vain
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["overlap"] is True and meta["summary"] == {k: v for k, v in summary.items() if k != "run_dir"}


def test_experiments_run_their_runs_in_overlap_mode(tmp_path, capsys):
    """The worked example's schedule does not change with overlap on the simulated runner (no host time, every
    request ends on its length): its figures are the same, and every run it wrote says overlap."""
    rc, plain, _ = _run(capsys, "experiment", "worked-example", "--format", "json")
    rc2, ahead, _ = _run(capsys, "experiment", "worked-example", "--format", "json", "--overlap", "--out",
                         str(tmp_path / "e"))
    assert rc == rc2 == 0
    assert json.loads(ahead)["rows"] == json.loads(plain)["rows"]
    for mode in ("static", "continuous"):
        meta = json.loads((tmp_path / "e" / f"worked-example-{mode}" / "run.json").read_text())
        assert meta["config"]["overlap"] is True


def test_calibrate_refuses_overlap(tmp_path, capsys):
    rc, _, err = _run(capsys, "calibrate", "--overlap", "--out", str(tmp_path / "c.json"))
    assert rc == 2 and err.strip().splitlines() == [
        "itertrace: error: --overlap: calibrate times iterations run one after the other; leave it out"]
    assert not (tmp_path / "c.json").exists()
