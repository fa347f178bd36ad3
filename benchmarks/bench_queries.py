"""Benchmark (not a test): gap attribution and TTFT reconstruction in SQL, beside pandas, on a large trace.

Builds a DuckDB database of at least --iterations iterations (default 1,000,000) by repeating a real
capture, `sample_traces/worked-example-continuous` (its nsys report and its run directory, ingested by
`itertrace.ingest`; 512 iterations, 3,584 ranges, 16 requests), K times with shifted clocks and ids, as
one long run on one thread would look: copy c shifts every timestamp (trace and run clocks) by c * span
(the sample's length plus 1 ms), iteration numbers by c * iterations per copy (step payloads, `tokens`
mark payloads, run log iterations), request ids by c * requests per copy (arrive/admit/finish mark
payloads, the ids in `tokens +a,b -c` mark texts, run log request ids and id lists), range ids and parent
range ids by c * ranges per copy, mark ids by c * marks per copy. A request still getting tokens at the
sample's last iteration stops at the next copy's first one, whose `tokens` mark says so (`-id`), so the
trace-side token views stay right. The copies are made in DuckDB SQL (CROSS JOIN range(K)), and copy 0
is checked to equal the sample row for row.

Then, in this one process and on that one database, it times each computation --repeat times (first
run and best run shown; wall seconds, and CPU seconds of the process, which other load on a shared
machine disturbs less):
- gap attribution: `SELECT * FROM host_gaps_parts`, and the pandas reference
  (benchmarks/pandas_reference.py) of the same computation;
- TTFT reconstruction from the run log: `request_latency_log`'s request_id, ttft_ns, tpot_ns,
  output_tokens, and its pandas reference.
- GPU time accounting, SQL only: `SELECT * FROM gpu_time` and `SELECT * FROM gpu_idle_parts`, after each
  `forward` range is given synthetic GPU work (three kernels on two streams and a stream synchronize,
  `_add_gpu_work`; the GPU projection stays empty, so gap attribution reads what it read before), timed
  and measured for memory the same way and printed beside gap attribution's SQL; with --before DIR
  (another checkout's queries/ folder), both also with that SQL and with this checkout's, and gap
  attribution's SQL beside them, each run in a fresh process, in turn.
Both SQL results are fetched as Arrow tables. The pandas figures are given with the loading of its
input DataFrames from DuckDB (`.df()`) and without it. Peak memory is measured apart, each computation
once in a fresh `spawn` child process: its peak RSS (VmHWM, reset after imports and opening the database;
ru_maxrss where that cannot be reset; DuckDB's allocations are native, so tracemalloc would not see
them), and that peak less the child's RSS just before the computation. The SQL and pandas results must
agree: row counts, column sums, every row (both sorted), with a sample of rows printed.

Usage: python benchmarks/bench_queries.py [--iterations N] [--repeat R] [--threads T] [--keep DB] [--capture FILE]
       [--before QUERIES_DIR]
(--keep DB writes the database there and reuses it on a later run when it holds the same copies.) The
figures of the latest runs are in benchmarks/RESULTS.md. The table's ratios: pandas over SQL for gap
attribution and TTFT (target: at least 10), and the GPU time views over gap attribution's SQL in the same
run (target for gpu_idle_parts: at most 2x its time, and a peak RSS under 3 GiB). The last lines time,
each alone, the steps any exact SQL formulation of gap attribution takes (`floor`), against the time the
x10 target leaves it.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "worked-example-continuous"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas_reference  # noqa: E402  (benchmarks/ is not a package)

# Tables copied unchanged (one thread, one process, one capture): the views read some of them.
AS_IS = ("threads", "processes", "capture_meta", "nvtx_domains", "nvtx_categories")
# The GPU projection stays empty (the sample is a CPU capture): each iteration's device interval stays its
# forward range, so gap attribution reads what it read before. cuda_api and gpu_ops get synthetic GPU work.
EMPTY = ("nvtx_gpu_projection",)
KERNELS_PER_FORWARD = 3


# --------------------------------------------------------------------------------------------------
# Building the large database


@dataclass(frozen=True)
class Copies:
    """How one copy of the sample shifts, and how many copies there are."""

    copies: int
    span_ns: int
    iterations: int  # per copy
    requests: int
    ranges: int
    marks: int


def ingest_sample(out: Path, capture: Path) -> Path:
    from itertrace.ingest import ingest

    db = out / "sample.duckdb"
    ingest([SAMPLE / "run", capture], db)
    return db


def plan(con: duckdb.DuckDBPyConnection, iterations: int) -> Copies:
    """Sizes of one copy of `src`, and the copies needed for `iterations` iterations."""
    (trace_lo, trace_hi, run_lo, run_hi, it_lo, it_hi, req_lo, req_hi, rg_lo, rg_hi, mk_lo, mk_hi) = con.execute("""
        SELECT
          least((SELECT min(start_ns) FROM src.nvtx_ranges), (SELECT min(ts_ns) FROM src.nvtx_marks)),
          greatest((SELECT max(coalesce(end_ns, start_ns)) FROM src.nvtx_ranges), (SELECT max(ts_ns) FROM src.nvtx_marks)),
          least((SELECT min(start_ns) FROM src.run_iterations), (SELECT min(ts_ns) FROM src.run_events),
                (SELECT min(arrival_ns) FROM src.run_requests)),
          greatest((SELECT max(end_ns) FROM src.run_iterations), (SELECT max(ts_ns) FROM src.run_events),
                   (SELECT max(finish_ns) FROM src.run_requests), (SELECT max(first_token_ns) FROM src.run_requests)),
          least((SELECT min(iteration) FROM src.run_iterations),
                (SELECT min(int64_value) FROM src.nvtx_ranges WHERE text = 'step')),
          greatest((SELECT max(iteration) FROM src.run_iterations),
                   (SELECT max(int64_value) FROM src.nvtx_ranges WHERE text = 'step')),
          (SELECT min(request_id) FROM src.run_requests),
          (SELECT max(request_id) FROM src.run_requests),
          (SELECT min(range_id) FROM src.nvtx_ranges),
          (SELECT max(range_id) FROM src.nvtx_ranges),
          (SELECT min(mark_id) FROM src.nvtx_marks),
          (SELECT max(mark_id) FROM src.nvtx_marks)
    """).fetchall()[0]
    per_copy = it_hi - it_lo + 1
    # One millisecond of idle time between the end of one copy and the start of the next.
    span = max(trace_hi - trace_lo, run_hi - run_lo) + 1_000_000
    return Copies(math.ceil(iterations / per_copy), span, per_copy, req_hi - req_lo + 1,
                  rg_hi - rg_lo + 1, mk_hi - mk_lo + 1)


def _shift_ids(expr: str, by: str) -> str:
    """SQL: `expr`, a list of ids, each plus `by`."""
    return f"list_transform({expr}, lambda x: x + {by})"


def build(src: Path, dest: Path, iterations: int) -> Copies:
    """Write to `dest` the sample database `src` repeated until it holds at least `iterations` iterations."""
    con = duckdb.connect(str(dest))
    try:
        con.execute(f"ATTACH '{src}' AS src (READ_ONLY)")
        p = plan(con, iterations)
        con.execute(f"SET VARIABLE copies = {p.copies}")
        t = f"(c.copy * {p.span_ns})"  # time shift
        it = f"(c.copy * {p.iterations})"
        rq = f"(c.copy * {p.requests})"
        rg = f"(c.copy * {p.ranges})"
        mk = f"(c.copy * {p.marks})"
        # The request ids in a `tokens +a,b -c` mark: each word after `tokens` is a sign and a list of ids.
        tokens_text = f"""array_to_string(list_transform(string_split(m.text, ' '), lambda w:
                            CASE WHEN w[1] IN ('+', '-')
                              THEN w[1] || array_to_string(list_transform(string_split(w[2:], ','),
                                                           lambda x: (x::BIGINT + {rq})::VARCHAR), ',')
                              ELSE w END), ' ')"""
        # Requests still getting tokens at the sample's last iteration have no `-id` in it: in a long
        # run they stop at the next copy's first iteration, so its first `tokens` mark says so.
        first_mark, still_open = _open_at_end(con)
        if still_open:
            ids = ", ".join(map(str, still_open))
            tokens_text = f"""{tokens_text} || CASE WHEN c.copy > 0 AND m.mark_id = {first_mark}
              THEN ' -' || array_to_string(list_transform([{ids}], lambda x: (x + (c.copy - 1) * {p.requests})::VARCHAR), ',')
              ELSE '' END"""
        copied = {
            "nvtx_ranges": f"""
                SELECT r.* REPLACE (
                  r.range_id + {rg} AS range_id,
                  r.parent_range_id + {rg} AS parent_range_id,
                  r.start_ns + {t} AS start_ns,
                  r.end_ns + {t} AS end_ns,
                  CASE WHEN r.text = 'step' THEN r.int64_value + {it} ELSE r.int64_value END AS int64_value)
                FROM src.nvtx_ranges AS r CROSS JOIN range(getvariable('copies')) AS c(copy)
                ORDER BY c.copy, r.range_id""",
            "nvtx_marks": f"""
                SELECT m.* REPLACE (
                  m.mark_id + {mk} AS mark_id,
                  m.ts_ns + {t} AS ts_ns,
                  CASE WHEN m.domain_name = 'itertrace' AND m.text LIKE 'tokens%' THEN {tokens_text}
                       ELSE m.text END AS text,
                  CASE WHEN m.domain_name = 'itertrace' AND m.text IN ('arrive', 'admit', 'finish') THEN m.int64_value + {rq}
                       WHEN m.domain_name = 'itertrace' AND m.text LIKE 'tokens%' THEN m.int64_value + {it}
                       ELSE m.int64_value END AS int64_value)
                FROM src.nvtx_marks AS m CROSS JOIN range(getvariable('copies')) AS c(copy)
                ORDER BY c.copy, m.mark_id""",
            "run_iterations": f"""
                SELECT i.* REPLACE (
                  i.iteration + {it} AS iteration,
                  i.start_ns + {t} AS start_ns,
                  i.end_ns + {t} AS end_ns,
                  {_shift_ids('i.member_ids', rq)} AS member_ids,
                  {_shift_ids('i.scheduled_ids', rq)} AS scheduled_ids,
                  {_shift_ids('i.finished_member_ids', rq)} AS finished_member_ids)
                FROM src.run_iterations AS i CROSS JOIN range(getvariable('copies')) AS c(copy)
                ORDER BY c.copy, i.rowid""",
            "run_events": f"""
                SELECT e.* REPLACE (
                  e.request_id + {rq} AS request_id,
                  e.iteration + {it} AS iteration,
                  e.ts_ns + {t} AS ts_ns)
                FROM src.run_events AS e CROSS JOIN range(getvariable('copies')) AS c(copy)
                ORDER BY c.copy, e.rowid""",
            "run_requests": f"""
                SELECT q.* REPLACE (
                  q.request_id + {rq} AS request_id,
                  q.arrival_ns + {t} AS arrival_ns,
                  q.first_scheduled_iteration + {it} AS first_scheduled_iteration,
                  q.first_token_ns + {t} AS first_token_ns,
                  q.finish_ns + {t} AS finish_ns,
                  q.deadline_ns + {t} AS deadline_ns)
                FROM src.run_requests AS q CROSS JOIN range(getvariable('copies')) AS c(copy)
                ORDER BY c.copy, q.rowid""",
            "run_meta": """
                SELECT m.* REPLACE (
                  m.iterations * getvariable('copies') AS iterations,
                  m.events * getvariable('copies') AS events,
                  m.requests * getvariable('copies') AS requests,
                  m.run_name || ' x' || getvariable('copies') AS run_name)
                FROM src.run_meta AS m""",
        }
        for table, sql in copied.items():
            con.execute(f"CREATE TABLE {table} AS {sql}")
        for table in AS_IS:
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
        for table in EMPTY:
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table} LIMIT 0")
        _add_gpu_work(con)
        _check_first_copy(con, copied)
        con.execute("DETACH src")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return p


def _add_gpu_work(con: duckdb.DuckDBPyConnection) -> None:
    """GPU work inside every `forward` range of duration d starting at s, on its thread's process, device 0.

    Kernel k (0, 1, 2) is launched by a call at s + k*d/4 (d/20 long) and runs d/3 from s + k*d/4 + d/20,
    on streams 7 and 8 in turn, so consecutive kernels overlap; a cudaStreamSynchronize runs from the
    last launch's end to the range's end. The GPU is idle at the start and end of each forward range
    (within the iteration) and from one forward range to the next (between iterations).
    """
    con.execute("CREATE TABLE cuda_api AS SELECT * FROM src.cuda_api LIMIT 0")
    con.execute("CREATE TABLE gpu_ops AS SELECT * FROM src.gpu_ops LIMIT 0")
    con.execute(f"""
        CREATE TEMP TABLE _forwards AS
        SELECT row_number() OVER (ORDER BY start_ns, range_id) AS n, global_tid, global_pid, start_ns,
               end_ns - start_ns AS d
        FROM nvtx_ranges WHERE domain_name = 'itertrace' AND text = 'forward' AND end_ns > start_ns""")
    con.execute(f"""
        INSERT INTO cuda_api (api_id, start_ns, end_ns, dur_ns, name, event_class, event_class_name, global_tid,
                              global_pid, pid, tid, correlation_id, return_value)
        WITH calls AS (
          SELECT f.n * 4 + k AS correlation_id, f.global_tid, f.global_pid, f.start_ns + k * f.d // 4 AS start_ns,
                 f.start_ns + k * f.d // 4 + f.d // 20 AS end_ns, 'cudaLaunchKernel_v7000' AS name
          FROM _forwards AS f CROSS JOIN range({KERNELS_PER_FORWARD}) AS r(k)
          UNION ALL
          SELECT f.n * 4 + 3, f.global_tid, f.global_pid, f.start_ns + 2 * f.d // 4 + f.d // 20, f.start_ns + f.d,
                 'cudaStreamSynchronize_v3020'
          FROM _forwards AS f)
        SELECT row_number() OVER (ORDER BY start_ns, global_tid, correlation_id), start_ns, end_ns,
               end_ns - start_ns, name, 0, 'CUDA runtime', global_tid, global_pid, (global_pid >> 24) & 16777215,
               global_tid & 16777215, correlation_id, 0
        FROM calls""")
    con.execute(f"""
        INSERT INTO gpu_ops (gpu_op_id, kind, start_ns, end_ns, dur_ns, name, short_name, device_id, context_id,
                             stream_id, correlation_id, global_pid, pid, launch_type)
        WITH ops AS (
          SELECT f.n * 4 + k AS correlation_id, k, f.global_pid, f.start_ns + k * f.d // 4 + f.d // 20 AS start_ns,
                 f.start_ns + k * f.d // 4 + f.d // 20 + f.d // 3 AS end_ns
          FROM _forwards AS f CROSS JOIN range({KERNELS_PER_FORWARD}) AS r(k))
        SELECT row_number() OVER (ORDER BY start_ns, correlation_id), 'kernel', start_ns, end_ns, end_ns - start_ns,
               'kernel_' || k::VARCHAR, 'kernel_' || k::VARCHAR, 0, 1, 7 + k % 2, correlation_id, global_pid,
               (global_pid >> 24) & 16777215, 'Regular'
        FROM ops""")
    con.execute("DROP TABLE _forwards")


def _open_at_end(con: duckdb.DuckDBPyConnection) -> tuple[int | None, list[int]]:
    """The sample's first `tokens` mark, and the requests still getting a token after its last one."""
    marks = con.execute("""SELECT mark_id, text FROM src.nvtx_marks
                           WHERE domain_name = 'itertrace' AND (text = 'tokens' OR text LIKE 'tokens %')
                           ORDER BY int64_value, ts_ns""").fetchall()
    if not marks:
        return None, []
    getting: set[int] = set()
    for _, text in marks:
        for word in text.split()[1:]:
            ids = {int(x) for x in word[1:].split(",") if x}
            getting = getting | ids if word[0] == "+" else getting - ids
    first_id, first_text = marks[0]
    if any(word.startswith("-") for word in first_text.split()[1:]):
        raise SystemExit(f"building the benchmark database: the sample's first tokens mark already stops requests: {first_text!r}")
    return first_id, sorted(getting)


def _build_or_reuse(sample: Path, dest: Path, iterations: int) -> tuple[Copies, bool]:
    """Build `dest`, or keep it when it already holds this sample repeated as many times as wanted."""
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{sample}' AS src (READ_ONLY)")
        wanted = plan(con, iterations)
        n_ranges = con.execute("SELECT count(*) FROM src.nvtx_ranges").fetchall()[0][0]
    finally:
        con.close()
    if dest.exists():
        try:
            with duckdb.connect(str(dest), read_only=True) as con:
                have = con.execute("SELECT (SELECT count(*) FROM run_iterations), (SELECT count(*) FROM nvtx_ranges), "
                                   "(SELECT count(*) > 0 FROM gpu_ops)").fetchall()[0]
            if have == (wanted.copies * wanted.iterations, wanted.copies * n_ranges, True):
                return wanted, True
        except duckdb.Error:
            pass
        dest.unlink()
    return build(sample, dest, iterations), False


def _check_first_copy(con: duckdb.DuckDBPyConnection, copied: dict[str, str]) -> None:
    """Copy 0 is the sample itself, row for row (list columns compared as text)."""
    for table in copied:
        if table == "run_meta":
            continue
        n_src = con.execute(f"SELECT count(*) FROM src.{table}").fetchall()[0][0]
        differ = con.execute(f"""
            SELECT count(*) FROM (
              (SELECT * FROM src.{table} EXCEPT ALL SELECT * FROM {table} LIMIT {n_src})
              UNION ALL
              (SELECT * FROM (SELECT * FROM {table} LIMIT {n_src}) EXCEPT ALL SELECT * FROM src.{table}))
        """).fetchall()[0][0]
        if differ:
            raise SystemExit(f"building the benchmark database: copy 0 of {table} differs from the sample in {differ} rows")


# --------------------------------------------------------------------------------------------------
# The two computations, each in SQL and in pandas

GAPS_SQL = "SELECT * FROM host_gaps_parts"
TTFT_SQL = "SELECT request_id, ttft_ns, tpot_ns, output_tokens FROM request_latency_log"
COMPUTATIONS = {
    "gap attribution": ("host_gaps_parts", GAPS_SQL, ["global_tid", "iteration", "phase"]),
    "TTFT reconstruction": ("request_latency_log", TTFT_SQL, ["request_id"]),
}
# GPU time accounting, in SQL only (no pandas reference): per GPU, and every idle span split by host cause.
GPU_TIME = {"GPU time": "SELECT * FROM gpu_time", "GPU idle parts": "SELECT * FROM gpu_idle_parts"}


def open_db(path: Path, threads: int | None):
    """The database as `itertrace query` opens it (read-only, locked, the default memory limit), with `threads`."""
    from itertrace.queries import QueryDB
    from itertrace.queries.api import connect

    return QueryDB(path, con=connect(path, threads=threads))


def run_sql(db, name: str):
    """The SQL result, as an Arrow table."""
    return db.sql(COMPUTATIONS[name][1] if name in COMPUTATIONS else GPU_TIME[name])


def load_pandas(db, name: str) -> tuple:
    """The pandas version's input DataFrames, read from DuckDB."""
    if name == "gap attribution":
        return (pandas_reference.load_ranges(db.con),)
    return pandas_reference.load_events(db.con), pandas_reference.load_requests(db.con)


def compute_pandas(name: str, inputs: tuple):
    if name == "gap attribution":
        return pandas_reference.gap_parts(*inputs)
    return pandas_reference.log_latency(*inputs)


@dataclass
class Timing:
    """Wall and CPU seconds of each run (CPU: this process, all threads)."""

    wall: list[float]
    cpu: list[float]

    @property
    def first(self) -> float:
        return self.wall[0]

    @property
    def best(self) -> float:
        return min(self.wall)

    @property
    def best_cpu(self) -> float:
        return min(self.cpu)


def timed(fn, timing: Timing):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    timing.wall.append(time.perf_counter() - wall)
    timing.cpu.append(time.process_time() - cpu)
    return out


# --------------------------------------------------------------------------------------------------
# Peak memory, each computation in a fresh process


def _rss_kb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_kb() -> int:
    """Peak RSS of this process (KiB): VmHWM, which _reset_peak() can reset, else ru_maxrss."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _reset_peak() -> None:
    """Forget the peak RSS reached while importing and opening (Linux: clear_refs 5 resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def _measure_child(path: str, threads: int | None, name: str, method: str, queue) -> None:
    db = open_db(Path(path), threads)
    db.con.sql("SELECT 1").fetchall()
    _reset_peak()
    before = _rss_kb()
    if method == "sql":
        rows = run_sql(db, name).num_rows
    else:
        rows = len(compute_pandas(name, load_pandas(db, name)))
    queue.put((before, _peak_kb(), rows))


def peak_memory(path: Path, threads: int | None, name: str, method: str) -> tuple[float, float]:
    """Peak RSS (MiB) of a fresh process that runs one computation once, and that peak less its RSS before."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_measure_child, args=(str(path), threads, name, method, queue))
    child.start()
    before, peak, _ = queue.get()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"the memory measurement of {name} ({method}) failed (exit {child.exitcode})")
    return peak / 1024, (peak - before) / 1024


# --------------------------------------------------------------------------------------------------
# Agreement


def agree(name: str, sql_table, frame) -> list[str]:
    """Lines saying how the SQL and pandas results compare; SystemExit when they differ at all.

    Row counts, the sum of every numeric column but the thread id (per phase too, for gaps), then
    every row: both sorted by the result's key, equal value for value (int, float and NULL alike).
    """
    import pandas as pd

    keys = COMPUTATIONS[name][2]
    sql = sql_table.to_pandas().sort_values(keys).reset_index(drop=True)
    pdf = frame.sort_values(keys).reset_index(drop=True)
    problems = []
    if len(sql) != len(pdf) or list(sql.columns) != list(pdf.columns):
        problems.append(f"SQL {len(sql):,} rows of {list(sql.columns)}, pandas {len(pdf):,} rows of {list(pdf.columns)}")
    sums = []
    for column in sql.columns:
        if column == "global_tid" or not pd.api.types.is_numeric_dtype(sql[column]):
            continue
        a, b = sql[column].sum(), pdf[column].sum() if column in pdf else None
        sums.append(f"sum({column}) {a:,.0f}" if float(a).is_integer() else f"sum({column}) {a:,.6f}")
        if a != b:
            problems.append(f"sum({column}): SQL {a!r}, pandas {b!r}")
    if name == "gap attribution" and not problems:
        by_phase = sql.groupby("phase")["dur_ns"].sum()
        if not by_phase.equals(pdf.groupby("phase")["dur_ns"].sum()):
            problems.append("the per-phase sums differ")
        sums.append("per phase: " + ", ".join(f"{p} {v:,}" for p, v in by_phase.items()))
    lines = [f"  {name}: {len(sql):,} rows (SQL), {len(pdf):,} (pandas); " + "; ".join(sums)]
    step = max(len(sql) // 4, 1)
    for i in sorted({*list(range(0, len(sql), step))[:4], len(sql) - 1} - {-1}):
        left = tuple(_plain(sql[c].iloc[i]) for c in sql.columns)
        right = tuple(_plain(pdf[c].iloc[i]) for c in pdf.columns) if i < len(pdf) else None
        lines.append(f"    row {i:>9,}: SQL {left}  pandas {right}{'' if left == right else '  DIFFERENT'}")
    if not problems:
        try:
            pd.testing.assert_frame_equal(sql, pdf, check_dtype=False, check_exact=True)
        except AssertionError as exc:
            problems.append(str(exc).strip().splitlines()[0])
    if problems:
        print("\n".join(lines))
        raise SystemExit(f"{name}: SQL and pandas results differ: " + "; ".join(problems))
    lines.append("    every row equal, value for value (both sorted by " + ", ".join(keys) + ")")
    return lines


def _plain(value):
    import pandas as pd

    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


# --------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from itertrace.ingest.nsys import find_nsys

    cores = os.cpu_count()
    print(f"machine: {cores} cores (os.cpu_count), {platform.machine()}, load average {_loadavg()}; "
          f"python {platform.python_version()}, duckdb {duckdb.__version__}, pandas {pd.__version__}, "
          f"numpy {np.__version__}, pyarrow {pa.__version__}")
    print(f"DuckDB threads: {args.threads or cores}{'' if args.threads else ' (default: all cores)'}; "
          f"pandas: one thread; runs per figure: {args.repeat} (first and best shown)")
    if args.capture.suffix == ".nsys-rep":
        find_nsys()
    with tempfile.TemporaryDirectory(prefix="itertrace-bench-queries-") as tmp:
        tmp = Path(tmp)
        path = args.keep if args.keep else tmp / "large.duckdb"
        started = time.perf_counter()
        sample = ingest_sample(tmp, args.capture)
        ingest_s = time.perf_counter() - started
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        copies, reused = _build_or_reuse(sample, path, args.iterations)
        build_s = time.perf_counter() - started
        with duckdb.connect(str(path), read_only=True) as con:
            counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                      for t in ("nvtx_ranges", "nvtx_marks", "run_iterations", "run_events", "run_requests")}
        print(f"database: {SAMPLE.relative_to(ROOT)} ingested in {ingest_s:.1f} s, repeated {copies.copies:,} times "
              f"(each copy: {copies.iterations} iterations, {copies.ranges:,} ranges, {copies.requests} requests, "
              f"shifted {copies.span_ns / 1e9:.3f} s) {'reused' if reused else f'in {build_s:.1f} s'}: "
              f"{path.stat().st_size / 2**20:,.0f} MiB"
              f"{' at ' + str(path) if args.keep else ' (temporary)'}")
        print("  " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
        results = {}
        db = open_db(path, args.threads)
        try:
            for name in COMPUTATIONS:
                sql_t, load_t, comp_t, total = Timing([], []), Timing([], []), Timing([], []), Timing([], [])
                for _ in range(args.repeat):
                    sql_result = timed(lambda: run_sql(db, name), sql_t)
                for _ in range(args.repeat):
                    inputs = timed(lambda: load_pandas(db, name), load_t)
                    frame = timed(lambda: compute_pandas(name, inputs), comp_t)
                    total.wall.append(load_t.wall[-1] + comp_t.wall[-1])
                    total.cpu.append(load_t.cpu[-1] + comp_t.cpu[-1])
                    del inputs
                results[name] = (sql_result, frame, sql_t, load_t, comp_t, total)
        finally:
            db.close()
        print("agreement (SQL view vs pandas reference, same database, same process):")
        for name, (sql_result, frame, *_) in results.items():
            print("\n".join(agree(name, sql_result, frame)))
        memory = {(name, method): peak_memory(path, args.threads, name, method)
                  for name in COMPUTATIONS for method in ("sql", "pandas")}
        print()
        header = (f"{'computation':20} {'rows':>10} {'SQL s':>13} {'pandas+load s':>14} {'pandas s':>13} "
                  f"{'load s':>7} {'ratio':>6} {'ratio':>6}   {'peak RSS MiB (+ over start)':>28}")
        print(header)
        print(f"{'':20} {'':>10} {'best (first)':>13} {'best (first)':>14} {'best (first)':>13} "
              f"{'best':>7} {'+load':>6} {'comp.':>6}   {'SQL':>13} {'pandas':>14}")
        for name, (sql_result, frame, sql_t, load_t, comp_t, total) in results.items():
            (sql_peak, sql_delta), (pd_peak, pd_delta) = memory[(name, "sql")], memory[(name, "pandas")]
            print(f"{name:20} {sql_result.num_rows:>10,} {sql_t.best:6.2f} ({sql_t.first:5.2f}) "
                  f"{total.best:6.2f} ({total.first:6.2f}) {comp_t.best:6.2f} ({comp_t.first:5.2f}) {load_t.best:7.2f} "
                  f"{total.best / sql_t.best:6.1f} {comp_t.best / sql_t.best:6.1f}   "
                  f"{sql_peak:6.0f} (+{sql_delta:5.0f}) {pd_peak:6.0f} (+{pd_delta:6.0f})")
        print("CPU seconds, least over the runs (this process, all threads; less disturbed by other load on the machine):")
        for name, (_, _, sql_t, load_t, comp_t, total) in results.items():
            print(f"  {name:20} SQL {sql_t.best_cpu:6.2f}  pandas+load {total.best_cpu:6.2f}  "
                  f"pandas {comp_t.best_cpu:6.2f}  load {load_t.best_cpu:6.2f}  "
                  f"ratio +load {total.best_cpu / sql_t.best_cpu:5.1f}  compute {comp_t.best_cpu / sql_t.best_cpu:5.1f}")
        iterations = counts["run_iterations"]
        print(f"ratio = pandas seconds / SQL seconds, best runs, at {iterations:,} iterations; target: at least 10.")
        floor(path, args, budget=results["gap attribution"][5].best / 10)
        gpu_time(path, args, gap_sql=results["gap attribution"][2], gap_peak=memory[("gap attribution", "sql")][0])
        if args.before:
            compare_sql(path, args)
        print(f"Load average at the end: {_loadavg()}")


# Steps that any exact SQL formulation of gap attribution takes, each timed alone: the gaps need the
# device intervals; pairing leaves with gaps in time order needs the phase ranges in time order (a sort,
# here with the cheapest streaming pass over it); a gap's time per phase needs its pairs added up by
# (gap, phase), a grouping as large as the result (here of the result rows themselves, on integer keys:
# the gap's place on its track and the phase's rank); and the result has to reach the caller. Their sum bounds what a single-query rewrite can reach on this machine.
FLOOR = {
    "device intervals and gaps": "SELECT count(*), sum(gap_ns) FROM _host_gaps_unordered",
    "phase ranges in time order": """
        SELECT sum(before_ns) FROM (SELECT lag(start_ns) OVER () AS before_ns FROM (
          SELECT r.global_tid, r.start_ns, r.end_ns, r.range_id
          FROM nvtx_ranges AS r JOIN host_gaps_phase_names AS n ON n.text = r.text
          WHERE r.range_kind = 'push_pop'
          ORDER BY r.global_tid, r.start_ns, r.end_ns DESC, r.range_id))""",
    "adding up by (gap, phase)": """
        SELECT count(*) FROM (SELECT global_tid, gap_seq, phase_rank, sum(dur_ns) FROM _parts GROUP BY ALL)""",
    "result rows to Arrow": "SELECT global_tid, iteration, phase, dur_ns FROM _parts",
}


def floor(path: Path, args: argparse.Namespace, budget: float) -> None:
    """Print the best time of each FLOOR step, their sum, and the time the x10 target leaves the SQL."""
    db = open_db(path, args.threads)
    try:
        db.con.execute("""CREATE TEMP TABLE _parts AS
                          SELECT p.*, coalesce(n.phase_rank, 0) AS phase_rank FROM _host_gaps_parts_keyed AS p
                          LEFT JOIN (SELECT DISTINCT phase, phase_rank FROM host_gaps_phase_names) AS n USING (phase)""")
        best = {}
        for step, sql in FLOOR.items():
            timing = Timing([], [])
            for _ in range(args.repeat):
                timed(lambda: db.con.sql(sql).to_arrow_table(), timing)
            best[step] = timing.best
    finally:
        db.close()
    print("gap attribution, steps any exact formulation takes, each alone (best wall s): "
          + ", ".join(f"{step} {s:.2f}" for step, s in best.items())
          + f"; sum {sum(best.values()):.2f} s against {budget:.2f} s for x10")


def gpu_time(path: Path, args: argparse.Namespace, gap_sql: Timing, gap_peak: float) -> None:
    """Time gpu_time and gpu_idle_parts (--repeat runs each) and their peak memory, beside gap attribution's SQL
    (its best time and `gap_peak`, its peak RSS in MiB).

    Checks the results first: busy time is what the synthetic GPU work makes it (per forward range of
    duration d, its three kernels cover one interval of 2d/4 + d/3), and the idle parts add up to the idle time.
    """
    db = open_db(path, args.threads)
    try:
        timings, results = {}, {}
        for name in GPU_TIME:
            timing = Timing([], [])
            for _ in range(args.repeat):
                results[name] = timed(lambda: run_sql(db, name), timing)
            timings[name] = timing
        expected_busy = db.con.execute("""
            SELECT sum((2 * (end_ns - start_ns)) // 4 + (end_ns - start_ns) // 3)::BIGINT FROM nvtx_ranges
            WHERE domain_name = 'itertrace' AND text = 'forward' AND end_ns > start_ns""").fetchall()[0][0]
    finally:
        db.close()
    ((row),) = results["GPU time"].to_pylist()
    parts_ns = sum(results["GPU idle parts"].column("dur_ns").to_pylist())
    if row["busy_ns"] != expected_busy or parts_ns != row["idle_ns"] or row["idle_ns"] != row["window_ns"] - row["busy_ns"]:
        raise SystemExit(f"GPU time: busy {row['busy_ns']:,} ns (expected {expected_busy:,}), idle {row['idle_ns']:,} ns, "
                         f"idle parts {parts_ns:,} ns: they should agree")
    print(f"GPU time accounting (SQL only), {KERNELS_PER_FORWARD} synthetic kernels per forward range: busy "
          f"{row['busy_ns']:,} ns as built; idle {row['idle_ns']:,} ns = within {row['idle_within_ns']:,} + between "
          f"{row['idle_between_ns']:,} + outside {row['idle_outside_ns']:,}, and the idle parts add up to it")
    print(f"{'computation':20} {'rows':>10} {'SQL s':>13} {'CPU s':>7} {'vs gaps':>8}   {'peak RSS MiB (+ over start)':>28}")
    peaks = {}
    for name, timing in timings.items():
        peak, delta = peaks[name] = peak_memory(path, args.threads, name, "sql")
        print(f"{name:20} {results[name].num_rows:>10,} {timing.best:6.2f} ({timing.first:5.2f}) {timing.best_cpu:7.2f} "
              f"{timing.best / gap_sql.best:7.2f}x   {peak:6.0f} (+{delta:5.0f})")
    print(f"{'gap attribution':20} {'':>10} {gap_sql.best:6.2f} ({gap_sql.first:5.2f}) {gap_sql.best_cpu:7.2f} "
          f"{1:7.2f}x   {gap_peak:6.0f} (its SQL, above)")
    parts, peak = timings["GPU idle parts"], peaks["GPU idle parts"][0]
    print(f"GPU idle parts / gap attribution: x{parts.best / gap_sql.best:.2f} wall, x{parts.best_cpu / gap_sql.best_cpu:.2f} "
          f"CPU (target: at most x2); peak RSS {peak:,.0f} MiB, x{peak / gap_peak:.2f} (target: under 3,072 MiB)")


def _gpu_child(path: str, threads: int | None, sql: str, queries: str | None, queue) -> None:
    """One run of `sql` in this fresh process, with the SQL modules of `queries` (a queries/ folder) if given."""
    if queries:
        from itertrace.queries import catalog

        catalog.SQL_DIR = Path(queries)
        catalog.modules.cache_clear()
    db = open_db(Path(path), threads)
    db.con.sql("SELECT 1").fetchall()
    _reset_peak()
    before = _rss_kb()
    wall, cpu = time.perf_counter(), time.process_time()
    rows = db.sql(sql).num_rows
    queue.put((time.perf_counter() - wall, time.process_time() - cpu, (_peak_kb() - before) / 1024, _peak_kb() / 1024, rows))


def compare_sql(path: Path, args: argparse.Namespace) -> None:
    """gpu_time and gpu_idle_parts with the SQL of --before and with this checkout's, side by side, and gap
    attribution's SQL beside them, so that the ratio to it compares runs measured alike.

    Each run is a fresh process (so each has its own peak RSS), the versions in turn, --repeat times.
    """
    ctx = multiprocessing.get_context("spawn")
    runs: dict[tuple[str, str], list[tuple]] = {}
    cases = [(name, sql, label, queries) for name, sql in GPU_TIME.items()
             for label, queries in (("before", str(args.before)), ("after", None))]
    cases.append(("gap attribution", GAPS_SQL, "after", None))
    for _ in range(args.repeat):
        for name, sql, label, queries in cases:
            queue = ctx.Queue()
            child = ctx.Process(target=_gpu_child, args=(str(path), args.threads, sql, queries, queue))
            child.start()
            out = queue.get()
            child.join()
            if child.exitcode != 0:
                raise SystemExit(f"{name} with the {label} SQL failed (exit {child.exitcode})")
            runs.setdefault((name, label), []).append(out)
    print(f"GPU time, the SQL of {args.before} (before) and of this checkout (after), and gap attribution's, each run "
          f"in a fresh process, in turn, {args.repeat} runs each (wall s, CPU s, peak RSS MiB: best of the runs; rows):")
    for (name, label), outs in runs.items():
        walls, cpus, peaks = [o[0] for o in outs], [o[1] for o in outs], [o[3] for o in outs]
        print(f"  {name:16} {label:6} wall {min(walls):6.2f} ({', '.join(f'{w:.2f}' for w in walls)})  "
              f"CPU {min(cpus):6.2f} ({', '.join(f'{c:.2f}' for c in cpus)})  peak {min(peaks):6.0f} MiB  "
              f"rows {outs[0][4]:,}")
    best = {key: (min(o[0] for o in outs), min(o[1] for o in outs), min(o[3] for o in outs)) for key, outs in runs.items()}
    gaps = best["gap attribution", "after"]
    for label in ("before", "after"):
        parts = best["GPU idle parts", label]
        print(f"  GPU idle parts ({label}) / gap attribution, fresh processes: x{parts[0] / gaps[0]:.2f} wall, "
              f"x{parts[1] / gaps[1]:.2f} CPU, peak RSS {parts[2]:,.0f} MiB against {gaps[2]:,.0f} "
              f"(targets: at most x2, under 3,072 MiB)")


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1_000_000,
                        help="at least this many iterations (default 1000000)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each computation; the best counts (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the large database here and keep it (default: a temporary folder); reused when it exists")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout's queries/ folder: time gpu_time and gpu_idle_parts with its SQL too, "
                             "beside this checkout's (each run in a fresh process, in turn)")
    parser.add_argument("--capture", type=Path, default=SAMPLE / "report.nsys-rep",
                        help="the sample's capture: its report (default; needs nsys) or an export of it "
                             "(`nsys export --type arrow`), for a machine without nsys")
    args = parser.parse_args()
    run(args)


if __name__ == "__main__":
    main()
