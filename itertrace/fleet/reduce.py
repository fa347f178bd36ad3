"""The reduction of `fleet summary`: the captures' partial tables, as Hive-partitioned Parquet, into the fleet's
tables, by DuckDB, and a DuckDB file of views over them.

Captures have separate clocks: nothing here joins two captures on time. Ranks are compared by iteration
number within a group (the ranks that ran the same iterations: one server's tensor-parallel ranks), on
each rank's iteration time: the length of its step range of that number.
"""
from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa

from itertrace.ingest.sqldoc import literal
from itertrace.targets import hidden_file

# Each table of the summary: its columns, each with what it holds (the views' column comments and docs/fleet.md).
TABLES: dict[str, tuple[str, dict[str, str]]] = {
    "fleet_ranks": ("Per capture, rank and GPU: the GPU time figures of gpu_time_summary, the iterations, their time "
                    "and the host-gap share.", {
        "capture": "The capture's name (fleet_captures.capture).",
        "rank": "The process's rank (see rank_source); NULL where nothing says.",
        "world_size": "Ranks in its job, where the capture says; NULL otherwise.",
        "rank_source": "Where the rank comes from: path (--rank-from), distributed_info (the trace's distributedInfo), "
                       "nccl (its NCCL communicator's payload), device (its GPU's device id).",
        "group": "The group of ranks it is compared with (fleet_groups); NULL without a rank.",
        "device_id": "CUDA device id (gpu_time_summary.device_id); NULL for a process without GPU work.",
        "global_pid": "Global id of the process in its capture.",
        "pid": "Operating-system process id.",
        "window_ns": "The capture window (gpu_time_summary.window_ns).",
        "busy_share": "Share of the window the GPU was busy (gpu_time_summary).",
        "idle_within_share": "Share of the window it sat idle within iterations.",
        "idle_between_share": "Share of the window it sat idle between iterations.",
        "idle_outside_share": "Share of the window it sat idle outside iterations.",
        "top_cause_kind": "Kind of the cause that took the most idle time.",
        "top_cause": "That cause.",
        "top_cause_share": "Its share of the GPU's idle time.",
        "top_causes": "The three largest causes, each as 'cause (kind): share of idle time'.",
        "window_source": "What the window is: the profiler's span or steps, or the GPU's work (gpu_time_summary).",
        "iterations": "Iterations of the process (step ranges that ended).",
        "iteration_p50_ns": "Median iteration time: the length of a step range.",
        "iteration_p99_ns": "99th percentile iteration time (nearest rank).",
        "host_gap_share": "Sum of its host gaps over the wall time of its iterations' device work (host_gaps_summary).",
    }),
    "fleet_iterations": ("Per capture and rank, each iteration's time.", {
        "capture": "The capture's name.",
        "rank": "The process's rank; NULL where nothing says.",
        "world_size": "Ranks in its job, where the capture says.",
        "group": "The group of ranks it is compared with; NULL without a rank.",
        "global_pid": "Global id of the process in its capture.",
        "iteration": "Iteration number (iterations.iteration, as the mapping numbers it).",
        "iteration_ns": "Its time: the length of the step range of that number (the longest, where the process "
                        "has several).",
        "device_ns": "The length of its device interval (iterations.device_dur_ns); NULL without one.",
        "gpu_ops": "GPU operations it launched.",
    }),
    "fleet_groups": ("Per group of ranks: its captures and ranks, and the iterations they have in common.", {
        "group": "The group: --group-from's match on the capture's path, else the folder of the capture's name; "
                 "for ranks that are device ids, the capture itself.",
        "world_size": "Ranks in the job, where the captures say; groups of one key and different world sizes differ.",
        "captures": "Captures with a rank in the group.",
        "ranks": "Distinct ranks found.",
        "missing_ranks": "Ranks below world_size that no capture of the group has; NULL without a world size.",
        "duplicate_ranks": "Ranks that more than one process of the group claims (their skew compares processes "
                           "that may not have run the same iterations).",
        "iterations": "Iteration numbers that at least two ranks have (fleet_skew's rows).",
        "common_iterations": "Iteration numbers that every rank of the group has.",
    }),
    "fleet_skew": ("Per group and iteration number: each rank's iteration time, the skew and the straggler.", {
        "group": "The group (fleet_groups).",
        "world_size": "Its world size.",
        "iteration": "Iteration number.",
        "ranks": "Ranks with this iteration (at least two).",
        "fastest_ns": "The fastest rank's iteration time.",
        "median_ns": "The median iteration time over the ranks (nearest rank, the lower of two).",
        "slowest_ns": "The slowest rank's iteration time.",
        "skew_ns": "slowest_ns - fastest_ns.",
        "straggler_rank": "The slowest rank (of equal times, the lowest); NULL where all ranks took the same time.",
        "straggler_capture": "The capture it comes from.",
        "fastest_rank": "The fastest rank (of equal times, the lowest); NULL where all took the same time.",
        "rank_times": "Each rank's iteration time, by rank: {rank, capture, iteration_ns}.",
    }),
    "fleet_stragglers": ("Per group and rank: how often it was the slowest, and by how much it ran behind the median.", {
        "group": "The group.",
        "world_size": "Its world size.",
        "rank": "The rank.",
        "capture": "The capture it comes from.",
        "iterations": "Iterations it was compared in (fleet_skew rows with it).",
        "slowest": "Iterations in which it was the slowest.",
        "slowest_share": "slowest / iterations.",
        "mean_behind_ns": "Mean of its iteration time minus the iteration's median.",
        "max_skew_ns": "The largest skew of the iterations it was slowest in; NULL if never.",
    }),
    "fleet_captures": ("Per capture: where it comes from, what it is, and whether it went through.", {
        "capture": "The capture's name: its path as given.",
        "source": "The capture file or export folder.",
        "run_dir": "The run directory ingested with it, or NULL.",
        "kind": "What it is: kineto, nsys-rep, arrow, arrowdir or parquetdir (capture_meta.source_kind).",
        "status": "done, ingest failed, or summary failed (see fleet_failures).",
        "processes": "Processes with GPU work or iterations.",
        "ranks": "Of them, those with a rank.",
        "gpus": "GPUs (device and process) with GPU work.",
        "database": "Its database; NULL where its ingest failed.",
    }),
    "fleet_failures": ("The captures that failed, each with its one-line error.", {
        "capture": "The capture's name.",
        "source": "The capture file or export folder.",
        "stage": "ingest or summary.",
        "error": "What went wrong, in one line.",
    }),
}

# Partial tables: Hive-partitioned by capture and rank, one folder each under the summary folder.
PARTIALS = {"fleet_ranks": "ranks", "fleet_iterations": "iterations"}
HIVE = "hive_partitioning = true, hive_types = {'capture': VARCHAR, 'rank': BIGINT}"

_REDUCE = """
CREATE TEMP TABLE members AS
SELECT DISTINCT "group", world_size, capture, global_pid, rank FROM fleet_ranks WHERE rank IS NOT NULL;

CREATE TEMP TABLE compared AS
SELECT "group", world_size, iteration, rank, capture, iteration_ns FROM fleet_iterations WHERE rank IS NOT NULL;

CREATE TABLE fleet_skew AS
SELECT "group", world_size, iteration, count(*) AS ranks, min(iteration_ns) AS fastest_ns,
       quantile_disc(iteration_ns, 0.5) AS median_ns, max(iteration_ns) AS slowest_ns,
       max(iteration_ns) - min(iteration_ns) AS skew_ns,
       CASE WHEN max(iteration_ns) > min(iteration_ns) THEN first(rank ORDER BY iteration_ns DESC, rank, capture) END
         AS straggler_rank,
       CASE WHEN max(iteration_ns) > min(iteration_ns) THEN first(capture ORDER BY iteration_ns DESC, rank, capture) END
         AS straggler_capture,
       CASE WHEN max(iteration_ns) > min(iteration_ns) THEN first(rank ORDER BY iteration_ns, rank, capture) END
         AS fastest_rank,
       list({'rank': rank, 'capture': capture, 'iteration_ns': iteration_ns} ORDER BY rank, capture) AS rank_times
FROM compared
GROUP BY ALL
HAVING count(*) >= 2
ORDER BY "group", world_size NULLS FIRST, iteration;

CREATE TABLE fleet_groups AS
WITH
  ranks AS (
    SELECT "group", world_size, rank, count(*) AS processes FROM members GROUP BY ALL),
  groups AS (
    SELECT "group", world_size, list(rank ORDER BY rank) AS ranks,
           list(rank ORDER BY rank) FILTER (WHERE processes > 1) AS duplicates
    FROM ranks GROUP BY ALL),
  captures AS (
    SELECT "group", world_size, count(DISTINCT capture) AS captures FROM members GROUP BY ALL),
  counted AS (
    SELECT "group", world_size, iteration, count(DISTINCT rank) AS ranks FROM compared GROUP BY ALL),
  iterations AS (
    SELECT c."group", c.world_size, count(*) FILTER (WHERE c.ranks >= 2) AS iterations,
           count(*) FILTER (WHERE c.ranks = len(g.ranks)) AS common_iterations
    FROM counted AS c JOIN groups AS g ON g."group" = c."group" AND g.world_size IS NOT DISTINCT FROM c.world_size
    GROUP BY ALL)
SELECT g."group", g.world_size, c.captures, len(g.ranks) AS ranks,
       CASE WHEN g.world_size IS NOT NULL THEN
         list_filter(range(g.world_size), lambda r: NOT list_contains(g.ranks, r)) END AS missing_ranks,
       coalesce(g.duplicates, []) AS duplicate_ranks,
       coalesce(i.iterations, 0) AS iterations, coalesce(i.common_iterations, 0) AS common_iterations
FROM groups AS g
JOIN captures AS c ON c."group" = g."group" AND c.world_size IS NOT DISTINCT FROM g.world_size
LEFT JOIN iterations AS i ON i."group" = g."group" AND i.world_size IS NOT DISTINCT FROM g.world_size
ORDER BY g."group", g.world_size NULLS FIRST;

CREATE TABLE fleet_stragglers AS
WITH
  behind AS (
    SELECT c."group", c.world_size, c.rank, c.capture, count(*) AS iterations,
           avg(c.iteration_ns - s.median_ns) AS mean_behind_ns
    FROM compared AS c
    JOIN fleet_skew AS s ON s."group" = c."group" AND s.world_size IS NOT DISTINCT FROM c.world_size
     AND s.iteration = c.iteration
    GROUP BY ALL),
  slowest AS (
    SELECT "group", world_size, straggler_rank AS rank, straggler_capture AS capture, count(*) AS slowest,
           max(skew_ns) AS max_skew_ns
    FROM fleet_skew WHERE straggler_rank IS NOT NULL GROUP BY ALL)
SELECT b."group", b.world_size, b.rank, b.capture, b.iterations, coalesce(s.slowest, 0) AS slowest,
       coalesce(s.slowest, 0) / b.iterations AS slowest_share, b.mean_behind_ns, s.max_skew_ns
FROM behind AS b
LEFT JOIN slowest AS s ON s."group" = b."group" AND s.world_size IS NOT DISTINCT FROM b.world_size
 AND s.rank = b.rank AND s.capture = b.capture
ORDER BY b."group", b.world_size NULLS FIRST, slowest DESC, b.mean_behind_ns DESC, b.rank;

CREATE TABLE fleet_captures AS
SELECT c.capture, c.source, c.run_dir, c.kind,
       CASE WHEN f.stage IS NOT NULL THEN f.stage || ' failed' ELSE 'done' END AS status,
       count(DISTINCT r.global_pid) AS processes,
       count(DISTINCT r.global_pid) FILTER (WHERE r.rank IS NOT NULL) AS ranks,
       count(r.device_id) AS gpus,
       CASE WHEN f.stage IS DISTINCT FROM 'ingest' THEN c.database END AS database
FROM captures AS c
LEFT JOIN fleet_failures AS f USING (capture)
LEFT JOIN fleet_ranks AS r USING (capture)
GROUP BY ALL
ORDER BY c.capture;
"""


def partial_select(folder: Path, table: str) -> str | None:
    """A SELECT of a partial table's rows from its Parquet files in `folder`, columns in the order the docs give;
    None where no capture wrote any."""
    files = folder / PARTIALS[table]
    if not any(files.rglob("*.parquet")):
        return None
    columns = ", ".join(f'"{c}"' for c in TABLES[table][1])
    return f"SELECT {columns} FROM read_parquet('{_quoted(files)}/**/*.parquet', {HIVE})"


def reduce(folder: Path, captures: pa.Table, failures: pa.Table, empty: dict[str, pa.Table]) -> dict[str, int]:
    """Write the fleet tables into `folder`, which holds the partials; `empty` holds each partial table with no
    rows, for where no capture wrote any. Returns the rows of each table."""
    with duckdb.connect() as con:
        con.register("captures", captures)
        con.register("failures_in", failures)
        con.execute("CREATE TABLE fleet_failures AS SELECT * FROM failures_in ORDER BY capture")
        _partials(con, folder, empty, "VIEW")
        con.execute(_REDUCE)
        for table in TABLES:
            if table not in PARTIALS:
                con.execute(f"COPY {table} TO '{_quoted(_file(folder, table))}' (FORMAT parquet)")
        return {table: con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] for table in TABLES}


def write_views(folder: Path, empty: dict[str, pa.Table]) -> Path:
    """`folder`/fleet.duckdb: a view per fleet table over its Parquet files in `folder` (an empty table where there
    are none), every column commented."""
    target = folder / "fleet.duckdb"
    building = hidden_file(target, "tmp")
    building.unlink()
    try:
        with duckdb.connect(str(building)) as con:
            _partials(con, folder, empty, "TABLE")
            for table, (doc, columns) in TABLES.items():
                if table not in PARTIALS:
                    con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{_quoted(_file(folder, table))}')")
                kind = con.execute("SELECT CASE WHEN count(*) THEN 'VIEW' ELSE 'TABLE' END FROM duckdb_views() "
                                   "WHERE view_name = ?", [table]).fetchall()[0][0]
                con.execute(f"COMMENT ON {kind} {table} IS {literal(doc)}")
                for column, text in columns.items():
                    con.execute(f'COMMENT ON COLUMN {table}."{column}" IS {literal(text)}')
        os.replace(building, target)
    except BaseException:
        building.unlink(missing_ok=True)
        raise
    return target


def _partials(con: duckdb.DuckDBPyConnection, folder: Path, empty: dict[str, pa.Table], kind: str) -> None:
    """A view of each partial table over its files; where there are none, a `kind` (TABLE or VIEW) of no rows."""
    for table in PARTIALS:
        select = partial_select(folder, table)
        if select is not None:
            con.execute(f"CREATE VIEW {table} AS {select}")
        else:
            con.register(f"_empty_{table}", empty[table])
            con.execute(f"CREATE {kind} {table} AS SELECT * FROM _empty_{table}")
            if kind == "TABLE":
                con.unregister(f"_empty_{table}")


def _file(folder: Path, table: str) -> Path:
    """The Parquet file of a reduced table."""
    return folder / f"{table.removeprefix('fleet_')}.parquet"


def _quoted(path: Path) -> str:
    """The absolute path, quoted for inside an SQL string literal."""
    return str(path.resolve()).replace("'", "''")
