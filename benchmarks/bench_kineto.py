"""Benchmark (not a test): ingest of PyTorch profiler (Kineto) traces, beside json.load and Holistic Trace Analysis.

Measures, each command in its own process and the commands taken in turn for ROUNDS rounds (so that a
busy spell of the machine falls on all of them alike), wall time and peak RSS (wait4) of:

- `itertrace ingest resnet_v100_ns_rank0.json.gz` (68,692 events), and the seconds the ingest itself
  reports (its closing line: the part after Python and the imports have started);
- `json.load` of the same file (gzip included), the least any Python reader of it does;
- Holistic Trace Analysis's `TraceAnalysis(trace_dir=...)` on it, when `--hta-python` names a Python
  that has HolisticTraceAnalysis installed (it is no dependency of this project: make a throwaway venv);
- the same sample repeated COPIES times with shifted times and ids, as one large uncompressed trace
  (313 MB at 20 copies), and at half that size, to show the ingest linear in the size:
  `itertrace ingest` (and its events/s), and `json.load`.

Usage: python benchmarks/bench_kineto.py [--copies 20] [--rounds 3] [--hta-python /tmp/hta/bin/python]
       [--out DIR] (or python benchmarks/bench_ingest.py --kineto ...)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "kineto_samples" / "resnet_v100_ns_rank0.json.gz"
JSON_LOAD = ("import gzip, json, sys; p = sys.argv[1]; "
             "f = gzip.open(p) if p.endswith('.gz') else open(p, 'rb'); print(len(json.load(f)['traceEvents']))")
HTA_LOAD = ("import sys, time; from hta.trace_analysis import TraceAnalysis; t = time.perf_counter(); "
            "TraceAnalysis(trace_dir=sys.argv[1]); print(f'load {time.perf_counter() - t:.3f} s', file=sys.stderr)")
_IDS = re.compile(rb'("(?:correlation|External id|id|Ev Idx)": )(\d+)')
_TS = re.compile(rb'("ts": )(\d+)')


def repeated(sample: Path, copies: int, out: Path) -> tuple[Path, int]:
    """`sample`'s events `copies` times over in one uncompressed trace, each copy later than the last and with
    ids of its own; (the file, its event count)."""
    text = gzip.decompress(sample.read_bytes())
    start = text.index(b"[", text.index(b'"traceEvents"'))
    events = json.loads(text)["traceEvents"]
    end = _array_end(text, start)
    body = text[start + 1:end].strip().rstrip(b",")
    times = [int(m.group(2)) for m in _TS.finditer(body)]
    span = max(times) - min(times) + 1000
    with open(out, "wb") as sink:
        sink.write(text[:start + 1])
        for k in range(copies):
            shifted = _TS.sub(lambda m: m.group(1) + str(int(m.group(2)) + k * span).encode(), body)
            shifted = _IDS.sub(lambda m: m.group(1) + str(int(m.group(2)) + k * 10_000_000).encode(), shifted)
            sink.write((b",\n" if k else b"") + shifted)
        sink.write(text[end:])
    return out, len(events) * copies


def _array_end(text: bytes, start: int) -> int:
    """Offset of the `]` closing the array that opens at `start` (json's own parser finds it)."""
    decoded = text.decode()
    return len(decoded[:json.JSONDecoder().raw_decode(decoded, start)[1]].encode()) - 1


def measure(argv: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, stderr) of one command run to completion."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed: {stderr.strip()[-400:]}")
    return wall, usage.ru_maxrss / 1024, stderr


def _reported(stderr: str, pattern: str) -> float | None:
    found = re.search(pattern, stderr)
    return float(found.group(1)) if found else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20, help="copies of the sample in the large trace (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every command, taken in turn (default 3)")
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis installed, to time its load")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench-kineto"))
    args = parser.parse_args(argv)
    if not SAMPLE.is_file():
        raise SystemExit(f"{SAMPLE}: the Kineto sample is not there")
    args.out.mkdir(parents=True, exist_ok=True)
    large, large_events = repeated(SAMPLE, args.copies, args.out / f"resnet_x{args.copies}.json")
    half, half_events = repeated(SAMPLE, args.copies // 2, args.out / f"resnet_x{args.copies // 2}.json")
    hta_dir = args.out / "hta"
    hta_dir.mkdir(exist_ok=True)
    (hta_dir / SAMPLE.name).write_bytes(SAMPLE.read_bytes())
    ingest = [sys.executable, "-m", "itertrace.cli", "ingest", "--db"]
    commands = {
        "itertrace ingest (sample)": [*ingest, str(args.out / "s.duckdb"), str(SAMPLE)],
        "json.load (sample)": [sys.executable, "-c", JSON_LOAD, str(SAMPLE)],
        f"itertrace ingest (x{args.copies // 2})": [*ingest, str(args.out / "h.duckdb"), str(half)],
        f"itertrace ingest (x{args.copies})": [*ingest, str(args.out / "l.duckdb"), str(large)],
        f"json.load (x{args.copies})": [sys.executable, "-c", JSON_LOAD, str(large)],
    }
    if args.hta_python:
        commands["HTA 0.5.0 TraceAnalysis (sample)"] = [args.hta_python, "-c", HTA_LOAD, str(hta_dir)]
    results: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, command in commands.items():
            wall, rss, stderr = measure(command)
            inner = _reported(stderr, r"rows from .* in ([\d.]+) s") or _reported(stderr, r"load ([\d.]+) s")
            results[name].append((wall, rss, inner))
    with open("/proc/loadavg") as load:
        loadavg = " ".join(load.read().split()[:3])
    events = {"sample": 68_692, f"x{args.copies // 2}": half_events, f"x{args.copies}": large_events}
    print(f"sample {SAMPLE.name}; large trace {large.stat().st_size / 1e6:.0f} MB ({large_events:,} events), "
          f"half {half.stat().st_size / 1e6:.0f} MB; {args.rounds} rounds; load average {loadavg}")
    print(f"{'command':34} {'wall s (median)':>16} {'inside s':>9} {'peak RSS MB':>12} {'events/s':>12}")
    medians = {}
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        inner = [r[2] for r in runs if r[2] is not None]
        inside = statistics.median(inner) if inner else None
        rss = max(r[1] for r in runs)
        key = name.split("(")[1].rstrip(")")
        rate = events[key] / (inside or wall)
        medians[name] = (wall, inside)
        print(f"{name:34} {wall:16.2f} {inside if inside is not None else float('nan'):9.2f} {rss:12.0f} {rate:12,.0f}")
    big, small = medians[f"itertrace ingest (x{args.copies})"], medians[f"itertrace ingest (x{args.copies // 2})"]
    print(f"ingest x{args.copies} / x{args.copies // 2}: {big[0] / small[0]:.2f} (wall), "
          f"{(big[1] or big[0]) / (small[1] or small[0]):.2f} (inside); "
          f"json.load / ingest at x{args.copies}: {medians[f'json.load (x{args.copies})'][0] / big[0]:.2f}")
    if args.hta_python:
        hta = medians["HTA 0.5.0 TraceAnalysis (sample)"]
        ours = medians["itertrace ingest (sample)"]
        print(f"HTA load / itertrace ingest of the sample: {hta[1] / ours[1]:.1f} (inside each: HTA's TraceAnalysis "
              f"call, itertrace's ingest), {hta[0] / ours[0]:.1f} (whole processes)")
    (args.out / "bench_kineto.json").write_text(json.dumps({"load_average": loadavg, "results": results}, indent=2))


if __name__ == "__main__":
    main()
