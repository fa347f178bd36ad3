"""Benchmark (not a test): ingest of PyTorch profiler (Kineto) traces, beside json.load and Holistic Trace Analysis.

Measures, each command in its own process and the commands taken in turn for ROUNDS rounds (so that a
busy spell of the machine falls on all of them alike), wall time, CPU time (user + system, every
thread) and peak RSS (wait4) of:

- `itertrace ingest resnet_v100_ns_rank0.json.gz` (68,692 events), the whole command;
- the `ingest()` call on the same file in a process of its own, timed after the imports, as HTA's
  call is (the command's closing line gives tenths of a second only);
- `json.load` of the same file (gzip included), the least any Python reader of it does;
- Holistic Trace Analysis's `TraceAnalysis(trace_dir=...)` on it, when `--hta-python` names a Python
  that has HolisticTraceAnalysis installed (it is no dependency of this project: make a throwaway venv);
- the same sample repeated COPIES times with shifted times and ids, as one large uncompressed trace
  (315 MB at 20 copies), and at half that size, to show the ingest linear in the size:
  `itertrace ingest` (and its events/s), and `json.load`;
- the fixed costs (FLOOR below).

Usage: python benchmarks/bench_kineto.py [--copies 20] [--rounds 3] [--hta-python /tmp/hta/bin/python]
       [--out DIR] (or python benchmarks/bench_ingest.py --kineto ...)

Floor
-----
The target of 10x HTA on the sample is out of reach with a DuckDB file as the result. Measured on a
2-core machine shared with other work (two runs of 3 rounds, load average 4.6 and 8.9; wall times
stretch with the load, CPU times much less):

- HTA's TraceAnalysis() takes 1.22 and 3.29 s (1.97-2.11 s CPU for its whole process); the ingest()
  call 0.59 and 1.78 s, 1.8-2.1x less; the whole `itertrace ingest` 2.1-2.2x less wall and 1.9-2.0x
  less CPU (0.97-1.10 s).
- What an ingest of 12 events costs (nothing to read, every step taken): 0.34-0.40 s wall; in one
  process, 0.19-0.24 s CPU of the sample's 0.52-0.58 s. In it, DuckDB starts its engine four times
  when the --db file exists (as in every round here), twice otherwise, each 15-26 ms CPU (about 50 ms
  wall when loaded): the database being built, the lock probe of the existing file before and after
  (itertrace/targets.py), and the read-only reopen that checks the written file (ingest/api.py). The
  ~170 COMMENT ON statements take 0.035-0.06 s, the dozen INSERTs of kineto.sql 0.06-0.14 s, most of
  it DuckDB's planning at this size; CHECKPOINT 0.02-0.04 s.
- Per event (profile of the sample, CPU): the staging INSERT 0.16 s, of which DuckDB's read_json of the
  array 0.07 s (0.023 s just to count it) and casts and json_extract 0.05 s; the split of the file 0.07 s,
  of which gzip 0.03 s; the INSERTs of kineto.sql 0.1 s.
- Before the call: interpreter start 0.07 s, `import duckdb` 0.12-0.31 s, every import of the command
  0.61-0.79 s, of which pyarrow and numpy are 40%: the nsys and run-directory loaders need them, a
  Kineto ingest does not.

So the least in-call time of this design is about 0.2 s CPU (gzip 0.03, DuckDB's parse 0.07, one engine
start 0.02, create + commit + checkpoint 0.05-0.07, the SQL 0.05), 6x under HTA's call (1.1-1.2 s CPU), and
the least whole command about 0.45 s. The design that would get there: one DuckDB engine per ingest,
ATTACHing the file it builds and probing the target's lock and re-reading the result through the same
engine (saves three engine starts); loaders registered by module name and imported only when one claims a
source (saves pyarrow and numpy for a Kineto ingest).

The 315 MB trace: 6.2-6.4 s CPU, 12.8-16.3 s wall under that load, 84,000-107,000 events/s, peak RSS
562-611 MB (json.load: 1,608 MB); x20 / x10 took 1.8-1.9x the CPU (1.8-2.6x the wall).
"""
from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "kineto_samples" / "resnet_v100_ns_rank0.json.gz"
JSON_LOAD = ("import gzip, json, sys; p = sys.argv[1]; "
             "f = gzip.open(p) if p.endswith('.gz') else open(p, 'rb'); print(len(json.load(f)['traceEvents']))")
HTA_LOAD = ("import sys, time; from hta.trace_analysis import TraceAnalysis; t = time.perf_counter(); "
            "TraceAnalysis(trace_dir=sys.argv[1]); print(f'load {time.perf_counter() - t:.3f} s', file=sys.stderr)")
# The ingest's own call, timed as HTA's is: after the imports, around the one call (the CLI's closing line
# gives tenths of a second only).
INGEST_CALL = ("import sys, time; from itertrace.ingest.api import ingest; t = time.perf_counter(); "
               "ingest(sys.argv[2:], sys.argv[1]); print(f'load {time.perf_counter() - t:.3f} s', file=sys.stderr)")
# The fixed costs the ingest cannot go below, each in a process of its own (see FLOOR in the docstring).
FLOOR_STEPS = {
    "interpreter start (python -c pass)": "pass",
    "import duckdb": "import duckdb",
    "imports of `itertrace ingest`": "import itertrace.ingest.api, itertrace.cli",
}
FLOOR_CALLS = """
import gzip, os, sys, time, duckdb
from itertrace.ingest.api import ingest
from itertrace.ingest.kineto_json import split_trace
from pathlib import Path
sample, out = Path(sys.argv[1]), Path(sys.argv[2])
def timed(label, work):
    t = time.perf_counter(); work(); print(f"{label}\t{time.perf_counter() - t:.4f}")
timed("gzip decompress of the sample", lambda: gzip.decompress(sample.read_bytes()))
events = out / "floor-events.json"
timed("split of the sample (decompress, copy the event array out)", lambda: split_trace(sample, events))
columns = "{'ph': 'VARCHAR', 'cat': 'VARCHAR', 'name': 'VARCHAR', 'pid': 'JSON', 'tid': 'JSON', " \
          "'ts': 'DECIMAL(22,3)', 'dur': 'DECIMAL(22,3)', 'id': 'JSON', 'args': 'JSON'}"
con = duckdb.connect()
timed("DuckDB read_json of the event array, counted only",
      lambda: con.execute(f"SELECT count(*) FROM read_json('{events}', format='array', columns={columns})").fetchall())
timed("DuckDB read_json of the event array into a table",
      lambda: con.execute(f"CREATE TABLE e AS FROM read_json('{events}', format='array', columns={columns})"))
db = out / "floor.duckdb"
def empty_database():
    db.unlink(missing_ok=True)
    c = duckdb.connect(str(db), config={"storage_compatibility_version": "v1.2.0", "default_block_size": "65536"})
    c.begin()
    for i in range(14):
        c.execute(f"CREATE TABLE t{i} (a BIGINT, b VARCHAR)")
    c.commit(); c.execute("CHECKPOINT"); c.close()
    duckdb.connect(str(db), read_only=True).close()
timed("DuckDB file: create 14 tables, commit, checkpoint, close, reopen", empty_database)
timed("ingest of a trace of 12 events (the sample's first ones)",
      lambda: ingest([out / "floor-tiny.json"], out / "t.duckdb"))
"""
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


def measure(argv: list[str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s (user + system, all threads), peak RSS MB, stderr) of one command run to completion."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed: {stderr.strip()[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, stderr


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
    # Built in another process: a child started later inherits this one's resident memory in its peak RSS.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        large, large_events = pool.submit(repeated, SAMPLE, args.copies,
                                          args.out / f"resnet_x{args.copies}.json").result()
        half, half_events = pool.submit(repeated, SAMPLE, args.copies // 2,
                                        args.out / f"resnet_x{args.copies // 2}.json").result()
        pool.submit(_tiny_trace, args.out / "floor-tiny.json").result()
    hta_dir = args.out / "hta"
    hta_dir.mkdir(exist_ok=True)
    (hta_dir / SAMPLE.name).write_bytes(SAMPLE.read_bytes())
    ingest = [sys.executable, "-m", "itertrace.cli", "ingest", "--db"]
    call = [sys.executable, "-c", INGEST_CALL]
    commands = {
        "itertrace ingest (sample)": [*ingest, str(args.out / "s.duckdb"), str(SAMPLE)],
        "ingest() call (sample)": [*call, str(args.out / "c.duckdb"), str(SAMPLE)],
        "json.load (sample)": [sys.executable, "-c", JSON_LOAD, str(SAMPLE)],
        f"itertrace ingest (x{args.copies // 2})": [*ingest, str(args.out / "h.duckdb"), str(half)],
        f"itertrace ingest (x{args.copies})": [*ingest, str(args.out / "l.duckdb"), str(large)],
        f"json.load (x{args.copies})": [sys.executable, "-c", JSON_LOAD, str(large)],
    }
    if args.hta_python:
        commands["HTA 0.5.0 TraceAnalysis (sample)"] = [args.hta_python, "-c", HTA_LOAD, str(hta_dir)]
    results: dict[str, list[tuple[float, float, float, float | None]]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, command in commands.items():
            wall, cpu, rss, stderr = measure(command)
            results[name].append((wall, cpu, rss, _reported(stderr, r"load ([\d.]+) s")))
    with open("/proc/loadavg") as load:
        loadavg = " ".join(load.read().split()[:3])
    events = {"sample": 68_692, f"x{args.copies // 2}": half_events, f"x{args.copies}": large_events}
    print(f"sample {SAMPLE.name}; large trace {large.stat().st_size / 1e6:.0f} MB ({large_events:,} events), "
          f"half {half.stat().st_size / 1e6:.0f} MB; {args.rounds} rounds; load average {loadavg}")
    print(f"{'command':34} {'wall s':>7} {'CPU s':>6} {'in-call s':>9} {'peak RSS MB':>11} {'events/s':>11}  (medians)")
    medians = {}
    for name, runs in results.items():
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        inner = [r[3] for r in runs if r[3] is not None]
        inside = statistics.median(inner) if inner else None
        rss = max(r[2] for r in runs)
        rate = events[name.rsplit("(", 1)[1].rstrip(")")] / (inside or wall)
        medians[name] = (wall, cpu, inside)
        shown = f"{inside:9.2f}" if inside is not None else f"{'':9}"
        print(f"{name:34} {wall:7.2f} {cpu:6.2f} {shown} {rss:11.0f} {rate:11,.0f}")
    big, small = medians[f"itertrace ingest (x{args.copies})"], medians[f"itertrace ingest (x{args.copies // 2})"]
    print(f"ingest x{args.copies} / x{args.copies // 2}: {big[0] / small[0]:.2f} (wall); "
          f"json.load / ingest at x{args.copies}: {medians[f'json.load (x{args.copies})'][0] / big[0]:.2f}")
    if args.hta_python:
        hta, whole, call = (medians[k] for k in ("HTA 0.5.0 TraceAnalysis (sample)", "itertrace ingest (sample)",
                                                  "ingest() call (sample)"))
        print(f"HTA / itertrace on the sample: {hta[2] / call[2]:.1f}x in-call (TraceAnalysis() vs ingest()), "
              f"{hta[0] / whole[0]:.1f}x whole process (wall), {hta[1] / whole[1]:.1f}x whole process (CPU)")
    floor = _floor(args.out, args.rounds)
    (args.out / "bench_kineto.json").write_text(json.dumps({"load_average": loadavg, "results": results,
                                                            "floor": floor}, indent=2))


def _floor(out: Path, rounds: int) -> dict[str, float]:
    """The fixed costs (median seconds of `rounds` runs), printed: interpreter start, imports, the gzip and
    JSON decode of the sample, an empty DuckDB file's create/checkpoint/reopen, a near-empty ingest."""
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, code in FLOOR_STEPS.items():
            runs.setdefault(label, []).append(measure([sys.executable, "-c", code])[0])
        done = subprocess.run([sys.executable, "-c", FLOOR_CALLS, str(SAMPLE), str(out)], check=True,
                              capture_output=True, text=True)
        for line in done.stdout.splitlines():
            label, seconds = line.split("\t")
            runs.setdefault(label, []).append(float(seconds))
    floor = {label: statistics.median(values) for label, values in runs.items()}
    print("fixed costs (median s):")
    for label, seconds in floor.items():
        print(f"  {label:62} {seconds:6.3f}")
    return floor


def _tiny_trace(path: Path) -> None:
    """The sample's top-level keys with its first 12 events: an ingest that does all its steps on almost no data."""
    document = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    document["traceEvents"] = document["traceEvents"][:12]
    path.write_text(json.dumps(document))


if __name__ == "__main__":
    main()
