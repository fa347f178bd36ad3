"""benchmarks/bench_fleet.py runs at a tiny size and prints its table, with the in-process check passed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_fleet.py"
SHARED = Path(__file__).parents[2] / ".." / "shared"

pytestmark = [pytest.mark.shared, pytest.mark.slow,
              pytest.mark.skipif(not (SHARED / "nsys_samples").is_dir(), reason=f"shared samples not found at {SHARED}")]


def test_the_benchmark_runs_and_prints_its_table(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--captures", "5", "--large-mb", "1", "--out",
                           str(tmp_path / "bench")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("bench_fleet: 5 captures (4 PyTorch profiler traces as ranks 0-3 of 4-rank servers, "
                               "1 Nsight Systems exports as nodes)")
    assert lines[1].split() == ["stage", "workers", "captures", "wall", "s", "captures/s", "start", "s", "peak", "RSS",
                                "per", "worker", "MB"]
    rows = [line.split() for line in lines[2:7]]
    assert [(r[0], r[-4] if r[1] == "this" else r[1]) for r in rows][:4] == [
        ("ingest", "1"), ("ingest", "2"), ("summary", "1"), ("summary", "2")]
    assert lines[6].startswith("summary  this process        5")
    assert any(line.startswith("the in-process summary's rows equal the 2-worker summary's: yes") for line in lines)
    (large,) = [line for line in lines if line.startswith("one ")]  # one resnet copy: the least it makes
    assert large.startswith("one 15 MB trace on 1 worker: ingest ") and "MB/s), peak RSS " in large
    assert not (tmp_path / "bench").exists()  # removed without --keep
