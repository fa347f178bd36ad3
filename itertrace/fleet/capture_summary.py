"""`fleet summary`'s task: one capture's database, opened read-only as `itertrace query` opens it, into two
Arrow tables: its ranks (per rank and GPU: the gpu_time_summary figures, iterations, iteration time p50/p99,
host-gap share) and its iterations (per rank: each iteration's time).

The figures come from the query library's views (gpu_time_summary, iterations, host_gaps_summary) under the
mapping `itertrace query` would use; each process's rank comes from the database (ranks.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from itertrace.errors import UserError
from itertrace.fleet.ingest_tasks import one_line
from itertrace.fleet.ranks import ranks_sql

# One iteration per process and number: the step ranges of that number (one per process, unless several of its
# threads run steps), the longest of them; open steps (no end) count for nothing.
_ITERATIONS = """
SELECT global_pid, iteration, max(host_dur_ns) AS iteration_ns, max(device_dur_ns) AS device_ns,
       sum(gpu_op_count)::BIGINT AS gpu_ops
FROM iterations WHERE host_dur_ns IS NOT NULL AND iteration IS NOT NULL GROUP BY ALL"""
# Per process, the host-gap share over its tracks: their gaps' sum over their wall time (host_gaps_summary).
_GAPS = """
SELECT t.global_pid, sum(h.gap_total_ns) / nullif(sum(h.wall_ns), 0) AS host_gap_share
FROM host_gaps_summary AS h JOIN (SELECT DISTINCT global_tid, global_pid FROM iterations) AS t USING (global_tid)
GROUP BY ALL"""
# Columns of gpu_time_summary, in its order (a test checks them against the view).
GPU_COLUMNS = ("device_id", "global_pid", "window_ns", "busy_share", "idle_within_share", "idle_between_share",
               "idle_outside_share", "top_cause_kind", "top_cause", "top_cause_share", "top_causes",
               "window_source")
_GPU_TYPES = ("BIGINT", "BIGINT", "BIGINT", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE", "VARCHAR", "VARCHAR", "DOUBLE",
              "VARCHAR[]", "VARCHAR")
# The capture's rows per process (and GPU), from the tables above.
_RANKS = f"""
SELECT $capture AS capture, p.rank, p.world_size, p.rank_source,
       CASE WHEN p.rank IS NULL THEN NULL WHEN p.rank_source = 'device' THEN $capture ELSE $group END AS "group",
       g.device_id, p.global_pid, (p.global_pid >> 24) & 16777215 AS pid,
       {", ".join(f"g.{c}" for c in GPU_COLUMNS[2:])},
       coalesce(i.iterations, 0) AS iterations, i.iteration_p50_ns, i.iteration_p99_ns, h.host_gap_share
FROM processes AS p
LEFT JOIN gpu AS g USING (global_pid)
LEFT JOIN (SELECT global_pid, count(*) AS iterations, quantile_disc(iteration_ns, 0.5) AS iteration_p50_ns,
                  quantile_disc(iteration_ns, 0.99) AS iteration_p99_ns
           FROM its GROUP BY ALL) AS i USING (global_pid)
LEFT JOIN gaps AS h USING (global_pid)
ORDER BY p.rank NULLS LAST, g.device_id NULLS LAST, p.global_pid"""
_ITERATION_ROWS = """
SELECT $capture AS capture, p.rank, p.world_size,
       CASE WHEN p.rank IS NULL THEN NULL WHEN p.rank_source = 'device' THEN $capture ELSE $group END AS "group",
       i.global_pid, i.iteration, i.iteration_ns, i.device_ns, i.gpu_ops
FROM its AS i JOIN processes AS p USING (global_pid)
ORDER BY p.rank NULLS LAST, i.global_pid, i.iteration"""


@dataclass(frozen=True)
class SummaryJob:
    """One capture's database and what its summary needs to know about it."""

    name: str
    db: str
    path_rank: int | None  # --rank-from's rank for it
    group_key: str  # its group, unless its ranks are its GPUs
    params: tuple[tuple[str, str], ...] = ()  # query parameters, e.g. the mapping's
    threads: int = 1
    memory_limit: str | None = None


@dataclass(frozen=True)
class SummaryOutcome:
    """One capture's two tables, or why it has none."""

    name: str
    error: str | None
    kind: str | None = None  # capture_meta.source_kind: kineto, nsys-rep, arrow, parquetdir, ...
    ranks: pa.Table | None = None
    iterations: pa.Table | None = None
    seconds: float = 0.0


def summarize_capture(job: SummaryJob) -> SummaryOutcome:
    """The task: the capture's ranks and iterations tables; any error comes back as one line."""
    started = time.monotonic()
    try:
        kind, ranks, iterations = capture_tables(job)
    except UserError as exc:
        return SummaryOutcome(job.name, one_line(str(exc)))
    except Exception as exc:  # noqa: BLE001 - a capture whose queries fail is reported, the fleet goes on
        return SummaryOutcome(job.name, one_line(f"{type(exc).__name__}: {exc}"))
    return SummaryOutcome(job.name, None, kind, ranks, iterations, time.monotonic() - started)


def capture_tables(job: SummaryJob) -> tuple[str | None, pa.Table, pa.Table]:
    """(kind, ranks, iterations) of one capture's database, opened read-only and locked down as `itertrace query`
    opens it: no other file, no extension, within the job's memory limit."""
    from itertrace.queries.api import QueryDB, connect

    con = connect(job.db, memory_limit=job.memory_limit or None, threads=job.threads)
    try:
        with QueryDB(job.db, dict(job.params), con=con) as db:
            tables = db.tables()
            kind = (db.sql("SELECT any_value(source_kind) AS kind FROM capture_meta")[0][0].as_py()
                    if "capture_meta" in tables else None)
            processes = db.sql(ranks_sql(tables, job.path_rank))
            traced = "nvtx_ranges" not in db.missing
            has_gpu = "gpu_ops" not in db.missing and db.sql("SELECT count(*) AS n FROM gpu_ops")[0][0].as_py() > 0
            gpu = db.query("gpu_time_summary") if has_gpu else None
            its = db.sql(_ITERATIONS) if traced else None
            gaps = db.sql(_GAPS) if traced else None
    finally:
        con.close()
    return (kind, *_combine(job, processes, gpu, its, gaps))


def _combine(job: SummaryJob, processes: pa.Table, gpu: pa.Table | None, its: pa.Table | None,
             gaps: pa.Table | None) -> tuple[pa.Table, pa.Table]:
    with duckdb.connect(config={"threads": 1}) as con:
        con.register("processes", processes)
        con.register("gpu", gpu if gpu is not None else _empty(GPU_COLUMNS, _GPU_TYPES))
        con.register("its", its if its is not None else _empty(
            ("global_pid", "iteration", "iteration_ns", "device_ns", "gpu_ops"), ("BIGINT",) * 5))
        con.register("gaps", gaps if gaps is not None else _empty(("global_pid", "host_gap_share"),
                                                                  ("BIGINT", "DOUBLE")))
        params = {"capture": job.name, "group": job.group_key}
        return (con.sql(_RANKS, params=params).to_arrow_table(),
                con.sql(_ITERATION_ROWS, params=params).to_arrow_table())


def empty_tables() -> tuple[pa.Table, pa.Table]:
    """(ranks, iterations) with their columns and no rows: what a capture without processes gives."""
    processes = _empty(("global_pid", "rank", "world_size", "rank_source"), ("BIGINT", "BIGINT", "BIGINT", "VARCHAR"))
    return _combine(SummaryJob("", "", None, ""), processes, None, None, None)


def _empty(columns: tuple[str, ...], types: tuple[str, ...]) -> pa.Table:
    with duckdb.connect() as con:
        return con.sql("SELECT " + ", ".join(f"NULL::{t} AS {c}" for c, t in zip(columns, types)) + " LIMIT 0"
                       ).to_arrow_table()
