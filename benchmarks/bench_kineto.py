"""Benchmark (not a test): a vLLM server's PyTorch profiler trace, ingested with and without its Python frames,
and the time to a first answer beside Holistic Trace Analysis.

The trace: the shared one-step vLLM trace (`../shared/serving_traces/vllm_decode_full_graph_step.json.gz`)
repeated STEPS times with shifted times and ids (`tests/serving_captures.py`), gzipped as vLLM writes it;
and the same without its `python_function` events, which is what the ingest stored before it read frames.
Each command runs in its own process, and the commands are taken in turn for ROUNDS rounds, so that a
busy spell of the machine falls on all of them alike. Measured: wall time, CPU time (user + system, every
thread and child) and peak RSS (wait4) of

- `itertrace ingest --store never` of the trace, and of the trace without frames (target: frames cost under 2x);
- the time to a first answer on the trace: `itertrace ingest` (which stores the answer of gpu_time_summary,
  queries/stored.py) then `itertrace query gpu_time_summary`; the same with `ingest --store never` (the query
  computes it); with `--before-python PYTHON`, the same with another checkout's interpreter (run without
  PYTHONPATH); against HTA 0.5.0's `TraceAnalysis(trace_dir=...)` then `get_temporal_breakdown()` on the same file, when
  `--hta-python` names a Python that has HolisticTraceAnalysis installed (no dependency of this project:
  make a throwaway venv; target: HTA takes 3x or more);
- queries on the two databases, with frames and without: `gpu_time_summary`, `iterations` and
  `mapping suggest` (whether frames in the ranges' table slow the queries over annotations);
- `json.load` of the trace, the least any Python reader of it does;
- with `--floor`, the fixed costs of a Kineto ingest (interpreter start, imports, DuckDB's engine and file,
  a near-empty ingest) on the HTA sample `../shared/kineto_samples/resnet_v100_ns_rank0.json.gz`.

Prints the medians and the ratios; writes every run to OUT/bench_kineto.json.

Usage: python benchmarks/bench_kineto.py [--steps 96] [--rounds 3] [--hta-python /tmp/hta-venv/bin/python]
       [--before-python PYTHON] [--floor] [--out DIR]    (or python benchmarks/bench_ingest.py --kineto ...)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serving_captures import build, path_of  # noqa: E402  (the tests' builder of multi-step traces)

STEP = "vllm_decode_full_graph_step"
SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "kineto_samples" / "resnet_v100_ns_rank0.json.gz"
JSON_LOAD = ("import gzip, json, sys; p = sys.argv[1]; "
             "f = gzip.open(p) if p.endswith('.gz') else open(p, 'rb'); print(len(json.load(f)['traceEvents']))")
HTA_ANSWER = ("import sys, time; from hta.trace_analysis import TraceAnalysis; t = time.perf_counter(); "
              "TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False); "
              "print(f'call {time.perf_counter() - t:.3f} s', file=sys.stderr)")
# The fixed costs of an ingest, each in a process of its own (--floor).
FLOOR_STEPS = {
    "interpreter start (python -c pass)": "pass",
    "import duckdb": "import duckdb",
    "imports of `itertrace ingest`": "import itertrace.ingest.api, itertrace.cli",
}
FLOOR_CALLS = """
import gzip, sys, time, duckdb
from itertrace.ingest.api import ingest
from itertrace.ingest.kineto_json import split_trace
from pathlib import Path
sample, out = Path(sys.argv[1]), Path(sys.argv[2])
def timed(label, work):
    t = time.perf_counter(); work(); print(f"{label}\t{time.perf_counter() - t:.4f}")
timed("gzip decompress of the sample", lambda: gzip.decompress(sample.read_bytes()))
events = out / "floor-events.json"
timed("split of the sample (decompress, copy the event array out)", lambda: split_trace(sample, events))
columns = "{'ph': 'VARCHAR', 'cat': 'VARCHAR', 'name': 'VARCHAR', 'pid': 'JSON', 'tid': 'JSON', " \\
          "'ts': 'DECIMAL(22,3)', 'dur': 'DECIMAL(22,3)', 'id': 'JSON', 'args': 'JSON'}"
con = duckdb.connect()
timed("DuckDB read_json of the event array, counted only",
      lambda: con.execute(f"SELECT count(*) FROM read_json('{events}', format='array', columns={columns})").fetchall())
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


def measure_all(argvs: list[list[str]]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of commands run one after the other, as one."""
    runs = [measure(argv)[:3] for argv in argvs]
    return sum(r[0] for r in runs), sum(r[1] for r in runs), max(r[2] for r in runs)


def traces(steps: int, out: Path) -> tuple[Path, Path]:
    """The vLLM-shaped trace of `steps` steps, gzipped, and the same without its frames."""
    made = []
    for label, drop in (("", frozenset()), ("-noframes", frozenset({"python_function"}))):
        plain = build(STEP, steps, out / f"vllm_x{steps}{label}.json", drop=drop)
        with open(plain, "rb") as source, gzip.open(out / f"{plain.name}.gz", "wb", compresslevel=6) as sink:
            shutil.copyfileobj(source, sink)
        plain.unlink()
        made.append(out / f"{plain.name}.gz")
    return made[0], made[1]


def commands(trace: Path, bare: Path, out: Path, hta_python: str | None,
             before_python: str | None = None) -> dict[str, list[list[str]]]:
    """Each measured command, as the argvs it runs one after the other."""
    cli = [sys.executable, "-m", "itertrace.cli"]
    framed_db, bare_db, answer_db = out / "frames.duckdb", out / "noframes.duckdb", out / "answer.duckdb"
    never = ["--store", "never"]  # the ingest alone: the queries on these databases compute their answers
    answer = out / "answer-computed.duckdb"
    found = {
        "ingest, frames": [[*cli, "ingest", str(trace), "--db", str(framed_db), *never]],
        "ingest, no frames": [[*cli, "ingest", str(bare), "--db", str(bare_db), *never]],
        "ingest + gpu_time_summary": [[*cli, "ingest", str(trace), "--db", str(answer_db)],
                                      [*cli, "query", "gpu_time_summary", "--db", str(answer_db)]],
        "  the same, --store never": [[*cli, "ingest", str(trace), "--db", str(answer), *never],
                                      [*cli, "query", "gpu_time_summary", "--db", str(answer)]],
    }
    if before_python:
        other, before = ["env", "-u", "PYTHONPATH", before_python, "-m", "itertrace.cli"], out / "answer-before.duckdb"
        found["  the same, --before-python"] = [[*other, "ingest", str(trace), "--db", str(before)],
                                                [*other, "query", "gpu_time_summary", "--db", str(before)]]
    found["json.load"] = [[sys.executable, "-c", JSON_LOAD, str(trace)]]
    for query in (["query", "gpu_time_summary"], ["query", "iterations"], ["mapping", "suggest"]):
        for label, db in (("frames", framed_db), ("no frames", bare_db)):
            found[f"{' '.join(query[1:] if query[0] == 'query' else query)}, {label}"] = [[*cli, *query, "--db", str(db)]]
    if hta_python:
        hta_dir = out / "hta"
        hta_dir.mkdir(exist_ok=True)
        shutil.copy(trace, hta_dir / trace.name)
        found["HTA load + temporal breakdown"] = [[hta_python, "-c", HTA_ANSWER, str(hta_dir)]]
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=96, help="steps of the vLLM trace (default 96: about 48 MB)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every command, taken in turn (default 3)")
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis installed, to time it")
    parser.add_argument("--floor", action="store_true", help="also measure the fixed costs of an ingest")
    parser.add_argument("--before-python", metavar="PYTHON",
                        help="another checkout's interpreter: time its ingest + gpu_time_summary too")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench-kineto"))
    args = parser.parse_args(argv)
    if not path_of(STEP).is_file():
        raise SystemExit(f"{path_of(STEP)}: the shared vLLM trace is not there")
    args.out.mkdir(parents=True, exist_ok=True)
    trace, bare = traces(args.steps, args.out)
    found = commands(trace, bare, args.out, args.hta_python, args.before_python)
    # the databases the queries read, made once before the rounds
    for name in ("ingest, frames", "ingest, no frames"):
        measure_all(found[name])
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in found}
    with open("/proc/loadavg") as load:
        load_before = " ".join(load.read().split()[:3])
    for _ in range(args.rounds):
        for name, argvs in found.items():
            results[name].append(measure_all(argvs))
    with open("/proc/loadavg") as load:
        loadavg = " ".join(load.read().split()[:3])
    medians = {name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                      max(r[2] for r in runs)) for name, runs in results.items()}
    print(f"{trace.name}: {args.steps} steps, {_events(trace):,} events, {trace.stat().st_size / 1e6:.1f} MB gzipped "
          f"({_size(trace) / 1e6:.1f} MB of JSON); without frames {_size(bare) / 1e6:.1f} MB; "
          f"{args.rounds} rounds; load average {load_before} before, {loadavg} after")
    print(f"{'command':34} {'wall s':>7} {'CPU s':>6} {'peak RSS MB':>11}  (medians)")
    for name, (wall, cpu, rss) in medians.items():
        print(f"{name:34} {wall:7.2f} {cpu:6.2f} {rss:11.0f}")
    ratios = {"ingest: frames / no frames": _ratio(medians["ingest, frames"], medians["ingest, no frames"])}
    for query in ("gpu_time_summary", "iterations", "mapping suggest"):
        ratios[f"{query}: frames / no frames"] = _ratio(medians[f"{query}, frames"], medians[f"{query}, no frames"])
    if args.hta_python:
        hta = medians["HTA load + temporal breakdown"]
        ratios["first answer: HTA / itertrace"] = _ratio(hta, medians["ingest + gpu_time_summary"])
        # the most the ratio can be with an ingest that took no time: what the query alone leaves
        ratios["ceiling: HTA / gpu_time_summary alone"] = _ratio(hta, medians["gpu_time_summary, frames"])
    for name, (wall, cpu) in ratios.items():
        print(f"{name:42} {wall:5.2f}x wall {cpu:5.2f}x CPU")
    if args.hta_python:
        budget = hta[0] / 3 - medians["gpu_time_summary, frames"][0]
        print(f"at 3x, the ingest may take {budget:.2f} s wall (HTA / 3 less gpu_time_summary); "
              f"it took {medians['ingest, frames'][0]:.2f} s")
    report = {"load_average": loadavg, "load_average_before": load_before, "steps": args.steps, "results": results, "ratios": ratios}
    if args.floor:
        report["floor"] = _floor(args.out, args.rounds)
    (args.out / "bench_kineto.json").write_text(json.dumps(report, indent=2))
    return report


def _ratio(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, float]:
    return a[0] / b[0], a[1] / b[1]


def _size(trace: Path) -> int:
    with gzip.open(trace, "rb") as source:
        return sum(len(chunk) for chunk in iter(lambda: source.read(1 << 22), b""))


def _events(trace: Path) -> int:
    with gzip.open(trace, "rb") as source:
        return len(re.findall(rb'"ph": ', source.read()))


def _floor(out: Path, rounds: int) -> dict[str, float]:
    """The fixed costs (median seconds of `rounds` runs), printed: interpreter start, imports, the gzip and
    JSON decode of the sample, an empty DuckDB file's create/checkpoint/reopen, a near-empty ingest."""
    if not SAMPLE.is_file():
        raise SystemExit(f"{SAMPLE}: the Kineto sample is not there")
    document = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    document["traceEvents"] = document["traceEvents"][:12]
    (out / "floor-tiny.json").write_text(json.dumps(document))
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


if __name__ == "__main__":
    main()
