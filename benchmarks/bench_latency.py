"""Benchmark (not a test): how long a command takes to answer, beside a bare DuckDB statement on the same file.

The database: the shared one-step vLLM trace (`../shared/serving_traces/vllm_decode_full_graph_step.json.gz`)
repeated STEPS times with shifted times and ids (`tests/serving_captures.py`), without its Python frames
unless `--frames`, ingested with `itertrace ingest`. Each command runs in its own process, and the commands
are taken in turn for ROUNDS rounds, so that a busy spell of the machine falls on all of them alike:

- the anchor: `python -c "import duckdb; duckdb.connect(DB).sql('SELECT 1')"`, the least a Python client pays;
- `itertrace sql --db DB "SELECT 1"` (target: at most 2x the anchor);
- `itertrace query gpu_time_summary --db DB` (target: under 0.4 s on a 48k-row capture, the default size);
- with `--before DIR` (another checkout's queries/ folder), that command again with the SQL modules of DIR,
  so that a change to the SQL is measured side by side with what it replaces;
- with `--before-python PYTHON` (the interpreter of another checkout's environment, run without PYTHONPATH),
  both itertrace commands again with that checkout's code, on the same database.

The database is ingested as `itertrace ingest` makes it, so with the answer of gpu_time_summary stored in it
(queries/stored.py); `--store never` ingests it without, so that the query computes its answer.

Prints the median wall and CPU time (user + system, every thread) of each, and each command's ratio to the
anchor, with the number of rounds and the load average; writes every run to OUT/bench_latency.json.

Usage: python benchmarks/bench_latency.py [--steps 96] [--rounds 7] [--frames] [--out DIR] [--before QUERIES_DIR]
       [--before-python PYTHON] [--store auto|never]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kineto import STEP, measure  # noqa: E402  (one command's wall, CPU and peak RSS)
from serving_captures import build, path_of  # noqa: E402  (the tests' builder of multi-step traces)

ANCHOR = "import sys, duckdb; duckdb.connect(sys.argv[1]).sql('SELECT 1').fetchall()"
# The command line with the SQL modules of another queries/ folder (argv[1]); the command's arguments follow.
WITH_SQL = ("import sys; from pathlib import Path; from itertrace.queries import catalog; "
            "catalog.SQL_DIR = Path(sys.argv[1]); from itertrace.cli import main; sys.exit(main(sys.argv[2:]))")


def commands(db: Path, before: Path | None = None, before_python: str | None = None) -> dict[str, list[str]]:
    """Each measured command's argv, the anchor first; with `before`, the query also with that folder's SQL;
    with `before_python`, both itertrace commands also with that interpreter's itertrace."""
    cli = [sys.executable, "-m", "itertrace.cli"]
    found = {"bare DuckDB SELECT 1": [sys.executable, "-c", ANCHOR, str(db)],
             "itertrace sql SELECT 1": [*cli, "sql", "--db", str(db), "SELECT 1"],
             "itertrace query gpu_time_summary": [*cli, "query", "gpu_time_summary", "--db", str(db)]}
    if before is not None:
        found["  the same, SQL of --before"] = [sys.executable, "-c", WITH_SQL, str(before),
                                               "query", "gpu_time_summary", "--db", str(db)]
    if before_python is not None:
        other = ["env", "-u", "PYTHONPATH", before_python, "-m", "itertrace.cli"]
        found["sql SELECT 1, --before-python"] = [*other, "sql", "--db", str(db), "SELECT 1"]
        found["gpu_time_summary, --before-python"] = [*other, "query", "gpu_time_summary", "--db", str(db)]
    return found


def database(steps: int, frames: bool, out: Path, store: str = "auto") -> tuple[Path, int]:
    """The ingested vLLM-shaped capture of `steps` steps (`itertrace ingest --store STORE`), and its rows over all
    tables but the stored answers."""
    import duckdb

    drop = frozenset() if frames else frozenset({"python_function"})
    trace = build(STEP, steps, out / f"vllm_x{steps}{'' if frames else '-noframes'}.json", drop=drop)
    db = out / f"{trace.stem}.duckdb"
    db.unlink(missing_ok=True)
    measure([sys.executable, "-m", "itertrace.cli", "ingest", str(trace), "--db", str(db), "--store", store])
    trace.unlink()
    with duckdb.connect(str(db), read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                           "AND table_name NOT LIKE '\\_stored%' ESCAPE '\\'").fetchall()]
        rows = sum(con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in names)
    return db, rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=96, help="steps of the vLLM trace (default 96: about 48k rows)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of every command, taken in turn (default 7)")
    parser.add_argument("--frames", action="store_true", help="keep the trace's Python frames (about 3x the rows)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench-latency"))
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout's queries/ folder: time gpu_time_summary with its SQL too, "
                             "in the same rounds")
    parser.add_argument("--before-python", default=None, metavar="PYTHON",
                        help="another checkout's interpreter: time both itertrace commands with its code too")
    parser.add_argument("--store", choices=("auto", "never"), default="auto",
                        help="ingest with the answer of gpu_time_summary stored (auto, the default) or not")
    args = parser.parse_args(argv)
    if not path_of(STEP).is_file():
        raise SystemExit(f"{path_of(STEP)}: the shared vLLM trace is not there")
    if args.before is not None and not (args.before / "gpu_time_summary.sql").is_file():
        raise SystemExit(f"--before {args.before}: not a queries/ folder (no gpu_time_summary.sql there)")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode compiled once, not by every command
    db, rows = database(args.steps, args.frames, args.out, args.store)
    found = commands(db, args.before, args.before_python)
    with open("/proc/loadavg") as load:
        load_before = " ".join(load.read().split()[:3])
    for argv_ in found.values():  # once each before the rounds: files in the page cache, bytecode compiled
        measure(argv_)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in found}
    for _ in range(args.rounds):
        for name, argv_ in found.items():
            results[name].append(measure(argv_)[:2])
    with open("/proc/loadavg") as load:
        loadavg = " ".join(load.read().split()[:3])
    medians = {name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
               for name, runs in results.items()}
    anchor = medians["bare DuckDB SELECT 1"]
    stored = "answer stored at ingest" if args.store == "auto" else "no answer stored"
    print(f"{db.name}: {args.steps} steps, {rows:,} rows, {stored}; {args.rounds} rounds; load average "
          f"{load_before} before, {loadavg} after")
    print(f"{'command':34} {'wall s':>7} {'CPU s':>6} {'wall / anchor':>13} {'CPU / anchor':>12}  (medians)")
    ratios = {}
    for name, (wall, cpu) in medians.items():
        ratios[name] = (wall / anchor[0], cpu / anchor[1])
        print(f"{name:34} {wall:7.3f} {cpu:6.3f} {ratios[name][0]:12.2f}x {ratios[name][1]:11.2f}x")
    report = {"load_average": loadavg, "load_average_before": load_before, "store": args.store, "steps": args.steps, "rows": rows, "frames": args.frames,
              "results": results, "ratios": ratios}
    (args.out / "bench_latency.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
