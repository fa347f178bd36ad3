"""Benchmark (not a test): the Kineto trace splitter (`ingest/kineto_json.py`) against JSON libraries doing its job.

The job: take a trace's `traceEvents` array out into a file of its own, for DuckDB's streaming
`read_json(format='array')`, and keep the other top-level keys. Ways measured, each in its own process:

- `split_trace`: this project's splitter, which copies the array's bytes as they are;
- `ijson items`: ijson (yajl2_c backend) streams the events, each written back with `json.dumps`; floats as
  floats (its fastest setting, which may change a time's last digit), the other keys not gathered;
- `json-stream`: json-stream (Rust tokenizer) streams the events, each written back with `json.dumps`;
- `orjson whole`: orjson parses the whole document and writes the events back;
- `json.load whole`: the standard library, the same;
- `DuckDB whole`: DuckDB reads the whole document (`read_json`, `traceEvents` as `JSON[]`) and counts the
  events through `unnest`: what the ingest would do without a split.

The libraries are no dependency of this project: install them into the virtual environment to measure
them (`pip install ijson json-stream orjson`); a way whose library is missing is left out and said so.
The traces: the shared one-step vLLM trace repeated STEPS times (`tests/serving_captures.py`), gzipped
as vLLM writes it (plain with `--plain`), and any given with `--trace`; the ways are taken in turn for
ROUNDS rounds. Measured: wall time, CPU time and peak RSS (wait4) of each way's process, and the time
of its work after its imports. Prints the medians, and each way's ratios to `split_trace`. A process's
peak RSS is at least this benchmark's own (about 30 MB: the child starts as its copy), which matters
only for small traces.

Usage: python benchmarks/bench_json_split.py [--steps 96[,384]] [--rounds 3] [--plain] [--trace FILE]... [--out DIR]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kineto import STEP, build, measure, path_of  # noqa: E402  (the Kineto benchmark's trace and timer)

OPEN = ("f = gzip.open(sys.argv[1]) if open(sys.argv[1], 'rb').read(2) == b'\\x1f\\x8b' else open(sys.argv[1], 'rb')\n"
        "out = sys.argv[2]\n")
STREAM = "sink = open(out, 'w'); sink.write('['); first = True\n"
WRITE = "    sink.write(('' if first else ',') + json.dumps(event)); first = False\nsink.write(']')\n"
# Each way: the module it needs, its imports (not timed as its work), and its work.
WAYS = {
    "split_trace": ("itertrace", "from itertrace.ingest.kineto_json import split_trace",
                    "split_trace(Path(sys.argv[1]), Path(sys.argv[2]))"),
    "ijson items": ("ijson", "import ijson", OPEN + STREAM +
                    "for event in ijson.items(f, 'traceEvents.item', use_float=True):\n" + WRITE),
    "json-stream": ("json_stream", "import json_stream", OPEN + STREAM +
                    "for event in json_stream.load(f)['traceEvents']:\n"
                    "    event = json_stream.to_standard_types(event)\n" + WRITE),
    "orjson whole": ("orjson", "import orjson", OPEN + "doc = orjson.loads(f.read())\n"
                     "open(out, 'wb').write(orjson.dumps(doc.pop('traceEvents')))"),
    "json.load whole": ("json", "", OPEN + "doc = json.load(f); json.dump(doc.pop('traceEvents'), open(out, 'w'))"),
    "DuckDB whole": ("duckdb", "import duckdb", "duckdb.sql(\"SELECT count(*) FROM (SELECT unnest(traceEvents) "
                     "FROM read_json(?, format = 'unstructured', maximum_object_size = 4000000000, "
                     "columns = {'traceEvents': 'JSON[]'}))\", params=[sys.argv[1]]).fetchall()"),
}


def program(imports: str, work: str) -> str:
    """A way as a program that prints the seconds of its work, after its imports, on stderr."""
    return (f"import gzip, json, sys, time\nfrom pathlib import Path\n{imports}\nstarted = time.perf_counter()\n"
            f"{work}\nprint(time.perf_counter() - started, file=sys.stderr)\n")


def trace_of(steps: int, plain: bool, out: Path) -> Path:
    """The vLLM-shaped trace of `steps` steps, gzipped unless `plain`."""
    path = build(STEP, steps, out / f"vllm_x{steps}.json")
    if plain:
        return path
    with open(path, "rb") as source, gzip.open(out / f"{path.name}.gz", "wb", compresslevel=6) as sink:
        shutil.copyfileobj(source, sink)
    path.unlink()
    return out / f"{path.name}.gz"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="96", help="steps of the vLLM trace, comma-separated (96: about 48 MB)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way, taken in turn (default 3)")
    parser.add_argument("--plain", action="store_true", help="plain JSON instead of gzipped")
    parser.add_argument("--trace", type=Path, action="append", default=[],
                        help="also this trace file (e.g. one of ../shared/kineto_samples)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench-json-split"))
    args = parser.parse_args(argv)
    if not path_of(STEP).is_file():
        raise SystemExit(f"{path_of(STEP)}: the shared vLLM trace is not there")
    args.out.mkdir(parents=True, exist_ok=True)
    ways = {name: program(imports, work) for name, (module, imports, work) in WAYS.items()
            if importlib.util.find_spec(module)}
    for name in WAYS.keys() - ways.keys():
        print(f"{name}: left out ({WAYS[name][0]} is not installed)")
    report: dict = {}
    traces = [trace_of(int(steps), args.plain, args.out) for steps in args.steps.split(",") if steps] + args.trace
    for trace in traces:
        events = args.out / "events.json"
        runs: dict[str, list[tuple[float, ...]]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, code in ways.items():
                wall, cpu, rss, stderr = measure([sys.executable, "-c", code, str(trace), str(events)])
                runs[name].append((wall, cpu, rss, float(stderr.split()[-1])))
                events.unlink(missing_ok=True)
        with open("/proc/loadavg") as load:
            loadavg = " ".join(load.read().split()[:3])
        med = {name: tuple(statistics.median(r[i] for r in rs) for i in range(4)) for name, rs in runs.items()}
        print(f"\n{trace.name}: {trace.stat().st_size / 1e6:.1f} MB; {args.rounds} rounds; load average {loadavg}")
        print(f"{'way':18} {'wall s':>7} {'work s':>7} {'CPU s':>6} {'peak RSS MB':>11} {'work x':>7} {'CPU x':>6} "
              f"{'RSS x':>6}  (medians; x: to split_trace)")
        base = med["split_trace"]
        for name, (wall, cpu, rss, work) in med.items():
            print(f"{name:18} {wall:7.2f} {work:7.2f} {cpu:6.2f} {rss:11.0f} {work / base[3]:7.1f} "
                  f"{cpu / base[1]:6.1f} {rss / base[2]:6.1f}")
        report[trace.name] = {"load_average": loadavg, "runs": runs}
    return report


if __name__ == "__main__":
    main()
