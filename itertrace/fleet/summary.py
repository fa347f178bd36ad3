"""`fleet summary`: a task per capture database returning its Arrow tables, the partials written as Hive-partitioned
Parquet as they come, the reduction by DuckDB over them, all under FLEET/summary/.

The summary is built in a hidden folder beside FLEET/summary and renamed into place when whole; then
fleet.duckdb, its views, is written into it. A summary that fails or is interrupted leaves the one before.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from itertrace.fleet.capture_summary import SummaryJob, SummaryOutcome, empty_tables, summarize_capture
from itertrace.fleet.layout import Fleet, read_manifest
from itertrace.fleet.reduce import PARTIALS, reduce, write_views
from itertrace.fleet.runner import TaskProgress, run_tasks
from itertrace.targets import hidden_folder, remove_leftovers

_FAILURES = pa.schema([("capture", pa.string()), ("source", pa.string()), ("stage", pa.string()),
                       ("error", pa.string())])
_CAPTURES = pa.schema([("capture", pa.string()), ("source", pa.string()), ("run_dir", pa.string()),
                       ("kind", pa.string()), ("database", pa.string())])


@dataclass(frozen=True)
class QuerySettings:
    """How each capture's database is queried: the query parameters, DuckDB threads and memory limit."""

    params: tuple[tuple[str, str], ...] = ()
    threads: int = 1
    memory_limit: str | None = None


@dataclass(frozen=True)
class FleetSummary:
    """What `fleet summary` wrote: the folder, and the rows of each table."""

    folder: Path
    captures: int  # with a database
    summarized: int
    failed: int  # in the summary (ingest failures are in fleet_failures too)
    rows: dict[str, int]
    seconds: float


def summarize_fleet(fleet: Fleet, client, *, settings: QuerySettings = QuerySettings(),
                    progress: TaskProgress | None = None, clock=time.monotonic) -> FleetSummary:
    """Summarize every capture of the fleet that has a database, a task each on `client` (None: in this
    process, one after another), and reduce their tables into FLEET/summary."""
    started = clock()
    entries = read_manifest(fleet)
    jobs = [SummaryJob(e.capture, str(fleet.database(e.capture)), e.path_rank, e.group_key, settings.params,
                       settings.threads, settings.memory_limit)
            for e in entries.values() if e.status == "done" and fleet.database(e.capture).is_file()]
    failures = [{"capture": e.capture, "source": e.source, "stage": "ingest", "error": e.error}
                for e in entries.values() if e.status == "failed"]
    kinds: dict[str, str | None] = {}
    remove_leftovers(fleet.summary)  # of summaries killed before they could clean up
    work = hidden_folder(fleet.summary, "work")
    progress = progress or TaskProgress("fleet summary", 0, enabled=False)
    progress.total = len(jobs)
    try:
        with duckdb.connect(config={"threads": 1}) as con:
            progress.start()
            for job, outcome in run_tasks(client, summarize_capture, jobs, lambda j, line: SummaryOutcome(j.name, line)):
                if outcome.error:
                    failures.append({"capture": job.name, "source": entries[job.name].source, "stage": "summary",
                                     "error": outcome.error})
                else:
                    kinds[job.name] = outcome.kind
                    _append(con, work, outcome)
                progress.count(failed=outcome.error is not None)
        progress.close()
        captures = pa.Table.from_pylist(
            [{"capture": e.capture, "source": e.source, "run_dir": e.run_dir, "kind": kinds.get(e.capture),
              "database": str(fleet.database(e.capture))} for e in sorted(entries.values(), key=lambda e: e.capture)],
            schema=_CAPTURES)
        ranks_none, iterations_none = empty_tables()
        empty = {"fleet_ranks": ranks_none, "fleet_iterations": iterations_none}
        rows = reduce(work, captures, pa.Table.from_pylist(failures, schema=_FAILURES), empty)
        _swap(work, fleet.summary)
    except BaseException:
        progress.close()
        shutil.rmtree(work, ignore_errors=True)
        raise
    write_views(fleet.summary, empty)
    failed = sum(1 for f in failures if f["stage"] == "summary")
    return FleetSummary(fleet.summary, len(jobs), len(jobs) - failed, failed, rows, clock() - started)


def _append(con: duckdb.DuckDBPyConnection, work: Path, outcome: SummaryOutcome) -> None:
    """Write one capture's tables under `work`, Hive-partitioned by capture and rank (DuckDB encodes the names)."""
    for table, rows in (("fleet_ranks", outcome.ranks), ("fleet_iterations", outcome.iterations)):
        if rows is None or not rows.num_rows:
            continue
        con.register("_rows", rows)
        target = str(work / PARTIALS[table]).replace("'", "''")
        con.execute(f"COPY _rows TO '{target}' (FORMAT parquet, PARTITION_BY (capture, rank), APPEND)")
        con.unregister("_rows")


def _swap(work: Path, summary: Path) -> None:
    """Put the summary built in `work` in place of the one at `summary` (if any)."""
    old = None
    if summary.exists():
        old = hidden_folder(summary, "work")
        os.rename(summary, old / "summary")
    os.rename(work, summary)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
