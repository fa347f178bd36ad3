"""Every benchmark in benchmarks/ runs at a tiny size, as a user runs it, and prints its table with numbers in it.

Nothing here reads a time: a benchmark measures, this only checks that it still runs and reports, so that
none can stop working unseen. (bench_fleet, bench_kineto and bench_simulated's trace mode have their own
test_bench_*.py.)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SHARED = ROOT.parent / "shared"
NUMBER = r"-?\d[\d,]*(?:\.\d+)?"

pytestmark = pytest.mark.slow


def _bench(script: str, *args: str, cwd: Path = ROOT) -> list[str]:
    """The lines `python benchmarks/SCRIPT ARGS` prints; it must exit 0."""
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def _row(lines: list[str], start: str) -> list[str]:
    """The words of the one line that starts with `start`."""
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0][len(start):].split()


def _numbers(words: list[str]) -> list[float]:
    """Every word of a table row that is a number (thousands separators, `x`, `(`, `)` and `+` stripped)."""
    out = []
    for word in words:
        word = word.strip("()+x%")
        if re.fullmatch(NUMBER, word):
            out.append(float(word.replace(",", "")))
    return out


@pytest.mark.nsys
@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not found (bench_queries ingests the sample's report)")
def test_bench_queries(tmp_path):
    lines = _bench("bench_queries.py", "--iterations", "1", "--repeat", "1", "--keep", str(tmp_path / "large.duckdb"),
                   "--before", str(ROOT / "queries"))
    assert "repeated 1 times (each copy: 512 iterations, 3,584 ranges, 16 requests" in lines[2], lines[2]
    assert lines[3] == "  nvtx_ranges 3,584, nvtx_marks 52, run_iterations 512, run_events 1,056, run_requests 16"
    assert sum(line.startswith("    every row equal, value for value") for line in lines) == 2
    sql_table = _after(lines, "computation                rows         SQL s  pandas+load s", 3)
    for row, (name, rows) in zip(sql_table[1:], (("gap attribution", 3_066), ("TTFT reconstruction", 16))):
        numbers = _numbers(row[len(name):].split())
        # rows; SQL, pandas+load, pandas (best, first); load; two ratios; SQL and pandas peaks (+ over start)
        assert row.startswith(name) and numbers[0] == rows and len(numbers) == 14, row
    gpu_table = _after(lines, "computation                rows         SQL s   CPU s  vs gaps", 3)
    assert [row[:20].strip() for row in gpu_table] == ["GPU time", "GPU idle parts", "gap attribution"]
    assert _numbers(gpu_table[0][20:].split())[0] == 1  # one GPU
    parts = _numbers(gpu_table[1][20:].split())
    assert parts[0] > 0 and len(parts) == 7, gpu_table[1]  # rows, best, first, CPU, ratio, peak, over start
    assert _numbers(gpu_table[2][20:].split())[3] == 1  # the anchor's own ratio
    ratio = " ".join(_row(lines, "GPU idle parts / gap attribution:"))
    assert re.fullmatch(rf"x{NUMBER} wall, x{NUMBER} CPU \(target: at most x2\); peak RSS {NUMBER} MiB, x{NUMBER} "
                        r"\(target: under 3,072 MiB\)", ratio), ratio
    # --before: each view with both SQL folders (here the same one) and gap attribution, each in a fresh process
    compared = _after(lines, "GPU time, the SQL of", 7)
    assert [row.split(" wall")[0].split() for row in compared[:5]] == [
        ["GPU", "time", "before"], ["GPU", "time", "after"], ["GPU", "idle", "parts", "before"],
        ["GPU", "idle", "parts", "after"], ["gap", "attribution", "after"]]
    for label, row in zip(("before", "after"), compared[5:]):
        assert re.fullmatch(rf"  GPU idle parts \({label}\) / gap attribution, fresh processes: x{NUMBER} wall, "
                            rf"x{NUMBER} CPU, peak RSS {NUMBER} MiB against {NUMBER} \(targets: at most x2, "
                            r"under 3,072 MiB\)", row), row


def _after(lines: list[str], header: str, n: int) -> list[str]:
    """The `n` lines after the one line that starts with `header`."""
    at = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert len(at) == 1, (header, lines)
    return lines[at[0] + 1:at[0] + 1 + n]


def test_bench_scheduler():
    lines = _bench("bench_scheduler.py", "--sizes", "16", "--rounds", "1", "--iterations", "5")
    assert lines[0].split()[:3] == ["case", "decode", "seqs"]
    for case in ("staggered", "synchronized"):
        numbers = _numbers(_row([line.strip() for line in lines], case))
        assert numbers[0] == 16 and len(numbers) == 6 and all(n > 0 for n in numbers), numbers


def test_bench_overlap():
    flags = ["--runner", "torch", "--workload", "synthetic", "--num-requests", "4", "--prompt-len", "8",
             "--output-len", "4", "--capacity", "4", "--hidden", "32", "--layers", "1", "--heads", "2",
             "--kv-heads", "2", "--intermediate", "64"]
    lines = _bench("bench_overlap.py", "--runs", "1", "--", *flags)
    assert lines[0] == "itertrace run " + " ".join(flags)
    assert lines[1] == "1 runs each way, alternating; median [min - max]"
    for metric in ("throughput_tok_s", "tpot_ms_p50", "host_gap_share", "gap_us_p50", "forward_us_p50", "cpu_per_wall"):
        words = _row(lines, metric)
        assert re.fullmatch(r"\d+(\.\d+)?(e[+-]\d+)?", words[-1]), (metric, words)  # the ratio on / off


def test_bench_simulated_workloads():
    lines = _bench("bench_simulated.py", "--requests", "40", "--compare", "20")
    for workload in ("default", "busy"):
        assert re.match(rf"40 requests, {NUMBER} iterations \({NUMBER} run in bulk\)", " ".join(_row(lines, f"{workload}:")))
        assert re.fullmatch(rf"20 requests, loop best of 3: one by one {NUMBER} s, in bulk {NUMBER} s: x{NUMBER}",
                            " ".join(_row(lines, f"{workload}, "))), workload


@pytest.mark.nsys
@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not found (bench_ingest profiles a program with it)")
def test_bench_ingest_nvtx_and_samples(tmp_path):
    lines = _bench("bench_ingest.py", "--steps", "20", "--repeat", "1", "--skip", "gpu", "--out", str(tmp_path))
    assert lines[0].startswith("NVTX-only capture (20 steps; report ")
    for command in ("nsys export --type sqlite", "itertrace ingest .arrow", "itertrace ingest .nsys-rep"):
        assert len(_numbers(_row(lines, f"| {command:56} |"))) >= 4, command
    assert re.search(rf"= {NUMBER}x the \.arrow ingest \(target >= 10\)", "\n".join(lines))
    for sample in ("worked-example-continuous", "worked-example-static"):
        assert re.match(rf"report {NUMBER} MB, database {NUMBER} MB \({NUMBER}x; target <= 2\)",
                        " ".join(_row(lines, f"{sample}:"))), sample


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "nsys_samples" / "h100_2gpu_1s_pqtdir").is_dir(),
                    reason=f"the shared H100 export is not at {SHARED / 'nsys_samples'}")
def test_bench_ingest_gpu(tmp_path):
    lines = _bench("bench_ingest.py", "--gpu-rows", "1", "--repeat", "1", "--skip", "nvtx", "--skip", "samples",
                   "--out", str(tmp_path))
    assert lines[0].startswith("GPU-shaped capture (h100_2gpu_1s_pqtdir x 1: ")
    assert len(_numbers(_row(lines, f"| {'itertrace ingest parquetdir':56} |"))) >= 5
    assert re.match(rf"{NUMBER} rows/s for the whole process, {NUMBER} rows/s by the ingest's own clock", lines[-2])
