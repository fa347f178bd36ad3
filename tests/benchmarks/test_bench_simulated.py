"""benchmarks/bench_simulated.py's trace mode runs, on a tiny trace, and prints its side-by-side table.

Nothing here reads a time: the benchmark measures, this only checks that it runs and reports.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_simulated.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600,
                          check=False)


def test_a_trace_runs_in_bulk_and_one_by_one_side_by_side(tmp_path):
    trace = tmp_path / "trace.jsonl"  # arrivals every 40 ms: some iterations in bulk, some one by one
    trace.write_text("".join(json.dumps({"timestamp": 40 * i, "input_length": 100 + 37 * (i % 9),
                                         "output_length": 20 + 11 * (i % 7)}) + "\n" for i in range(300)))
    done = _bench("--trace", str(trace), "--limit", "200", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{trace}: 200 requests, ") and "run in bulk" in lines[0], lines
    assert lines[1].startswith("1 round(s)") and "load average" in lines[1], lines
    assert lines[2].split() == ["wall", "s", "CPU", "s", "peak", "RSS", "MiB", "of", "60", "s", "target"]
    assert [line.split()[:-4] for line in lines[3:5]] == [["in", "bulk"], ["one", "by", "one"]]
    assert lines[5].startswith("one by one / in bulk (wall, medians): x") and "target / in bulk: x" in lines[5]


def test_a_trace_file_that_is_not_there_is_skipped(tmp_path):
    done = _bench("--trace", str(tmp_path / "absent.csv"))
    assert done.returncode == 0
    assert done.stdout.strip() == f"bench_simulated: skipped: no trace file at {tmp_path / 'absent.csv'}"
