"""`itertrace report --fleet FLEET`: the fleet's page, from FLEET/summary, and each capture's own report.

The page reads the summary's Parquet files in a DuckDB session that can read nothing else: ranks by busy
share and idle cause, the skew between ranks by iteration, the stragglers, the groups, the failures, and
a link per capture to its report. Each capture's report (FLEET/reports/NAME.html) is `itertrace report`
of its database, made as a task on the fleet's Dask client where it is missing or older than the database.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import duckdb
import pyarrow as pa

from itertrace.dashboards.blocks import ChartBlock, NoteBlock, Report, Section, TableBlock
from itertrace.dashboards.fleet_charts import rank_shares_chart, skew_chart
from itertrace.errors import UserError
from itertrace.fleet.layout import Fleet

TOP_ROWS = 40
_TABLES = ("ranks", "iterations", "groups", "skew", "stragglers", "captures", "failures")


@dataclass(frozen=True)
class ReportJob:
    """One capture's report to write."""

    name: str
    db: str
    out: str
    params: tuple[tuple[str, str], ...] = ()  # query parameters, e.g. the mapping's


@dataclass(frozen=True)
class ReportOutcome:
    name: str
    error: str | None


def write_capture_report(job: ReportJob) -> ReportOutcome:
    """The task: `itertrace report` of one capture's database into its page; any error comes back as one line."""
    from itertrace.dashboards.html import write_report
    from itertrace.dashboards.report import build_report
    from itertrace.fleet.ingest_tasks import one_line
    from itertrace.targets import Kind, remove_leftovers, replaceable

    try:
        out = Path(job.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out = replaceable(out, Kind.REPORT, "report")
        remove_leftovers(out)
        write_report(build_report([job.db], [job.name], title=f"itertrace report: {job.name}",
                                  params=dict(job.params)), out)
    except UserError as exc:
        return ReportOutcome(job.name, one_line(str(exc)))
    except Exception as exc:  # noqa: BLE001 - one capture's report failing leaves the others
        return ReportOutcome(job.name, one_line(f"{type(exc).__name__}: {exc}"))
    return ReportOutcome(job.name, None)


def report_jobs(fleet: Fleet, captures: list[str], params: tuple[tuple[str, str], ...] = ()) -> list[ReportJob]:
    """The captures whose report is missing or older than their database."""
    jobs = []
    for name in captures:
        db, out = fleet.database(name), fleet.report(name)
        if not out.is_file() or out.stat().st_mtime < db.stat().st_mtime:
            jobs.append(ReportJob(name, str(db), str(out), params))
    return jobs


def check_summary(fleet: Fleet) -> None:
    """A UserError where the fleet has no summary to show."""
    if not (fleet.summary / "captures.parquet").is_file():
        raise UserError(f"{fleet.root}: no summary yet; run `itertrace fleet summary {fleet.root}` first")


def summary_connection(fleet: Fleet) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB session with a view per summary table, able to read FLEET/summary and nothing else."""
    check_summary(fleet)
    folder = fleet.summary.resolve()
    con = duckdb.connect()
    try:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET allowed_directories = ?", [[f"{folder}/"]])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        from itertrace.fleet.reduce import HIVE

        for table in _TABLES:
            if table in _NONE:  # a partial table: Hive-partitioned, absent where no capture had rows of it
                files = folder / table
                select = (f"SELECT * FROM read_parquet('{_quoted(files)}/**/*.parquet', {HIVE})"
                          if files.is_dir() and any(files.rglob("*.parquet")) else _NONE[table])
            else:
                select = f"SELECT * FROM read_parquet('{_quoted(folder / f'{table}.parquet')}')"
            con.execute(f"CREATE VIEW {table} AS {select}")
    except BaseException:
        con.close()
        raise
    return con


# What a partial table is when no capture wrote rows of it: only the columns the page reads.
_NONE = {
    "ranks": ("SELECT NULL::VARCHAR AS capture, NULL::BIGINT AS rank, NULL::BIGINT AS device_id, "
              "NULL::DOUBLE AS busy_share, NULL::DOUBLE AS idle_within_share, NULL::DOUBLE AS idle_between_share, "
              "NULL::DOUBLE AS idle_outside_share, NULL::VARCHAR AS top_cause_kind, NULL::VARCHAR AS top_cause, "
              "NULL::DOUBLE AS top_cause_share, NULL::BIGINT AS iterations, NULL::BIGINT AS iteration_p50_ns, "
              "NULL::BIGINT AS iteration_p99_ns, NULL::DOUBLE AS host_gap_share, NULL::BIGINT AS world_size, "
              "NULL::VARCHAR AS rank_source LIMIT 0"),
    "iterations": "SELECT NULL::VARCHAR AS capture, NULL::BIGINT AS rank LIMIT 0",
}


def build_fleet_report(fleet: Fleet, page: Path, *, title: str | None = None) -> Report:
    """The fleet's page, to be written at `page` (links to the captures' reports are relative to it)."""
    con = summary_connection(fleet)
    try:
        captures = con.sql("SELECT * FROM captures ORDER BY capture").to_arrow_table()
        reports = {name: _href(page, fleet.report(name)) for name in captures.column("capture").to_pylist()
                   if fleet.report(name).is_file()}
        meta = _captures_table(captures, reports)
        sections = [_ranks(con), _causes(con), _skew(con), _stragglers(con), _groups(con), _failures(con)]
    finally:
        con.close()
    return Report(title=title or f"itertrace fleet: {fleet.root.resolve().name}", meta=meta, simulated=(),
                  sections=tuple(sections), meta_title="Captures")


def _captures_table(captures: pa.Table, reports: dict[str, str]) -> pa.Table:
    rows = []
    for row in captures.to_pylist():
        name = row["capture"]
        rows.append({"capture": name, "kind": row["kind"], "status": row["status"], "ranks": row["ranks"],
                     "gpus": row["gpus"],
                     "report": {"text": "report", "href": reports[name]} if name in reports else None})
    return pa.Table.from_pylist(rows) if rows else captures


def _href(page: Path, target: Path) -> str:
    return quote(os.path.relpath(target.resolve(), page.resolve().parent).replace(os.sep, "/"))


def _ranks(con: duckdb.DuckDBPyConnection) -> Section:
    section = Section("fleet-ranks", "Ranks by busy share",
                      "Per capture, rank and GPU: the share of its capture window the GPU was busy, and how its idle "
                      "time splits into within, between and outside iterations (gpu_time_summary of each capture's "
                      "database; each share divides by that capture's own window). Least busy first.")
    ranks = con.sql("SELECT * FROM ranks WHERE device_id IS NOT NULL").to_arrow_table()
    if not ranks.num_rows:
        section.blocks.append(NoteBlock("No capture of the fleet holds GPU work."))
        return section
    section.blocks.append(ChartBlock("fleet-rank-shares", rank_shares_chart(ranks, max_ranks=TOP_ROWS),
                                     "Green: busy. Orange, red, grey: idle within, between and outside iterations."))
    table = con.sql(f"""
        SELECT capture, rank, device_id, busy_share, idle_within_share, idle_between_share, idle_outside_share,
               top_cause, top_cause_share, iterations, iteration_p50_ns, iteration_p99_ns, host_gap_share
        FROM ranks WHERE device_id IS NOT NULL
        ORDER BY busy_share, capture, rank, device_id LIMIT {TOP_ROWS}""").to_arrow_table()
    shown = f"The {TOP_ROWS} least busy of {ranks.num_rows} GPUs" if ranks.num_rows > TOP_ROWS \
        else f"{ranks.num_rows} GPUs, the least busy first"
    section.blocks.append(TableBlock(shown, table,
                                     "top cause: what the host was doing during most of the GPU's idle time (its share "
                                     "of that idle time); iteration p50/p99: step range lengths; host gap share: "
                                     "host gaps over the wall time of the iterations' device work."))
    return section


def _causes(con: duckdb.DuckDBPyConnection) -> Section:
    section = Section("fleet-causes", "Idle causes across the fleet",
                      "Each GPU's largest idle cause (what the host was doing meanwhile: an NVTX range, a CUDA API "
                      "call, or unattributed), counted over the fleet's GPUs.")
    table = con.sql("""
        SELECT top_cause_kind, top_cause, count(*) AS gpus, avg(top_cause_share) AS mean_idle_share,
               avg(1 - busy_share) AS mean_idle_of_window_share
        FROM ranks WHERE device_id IS NOT NULL AND top_cause IS NOT NULL
        GROUP BY ALL ORDER BY gpus DESC, top_cause_kind, top_cause LIMIT 20""").to_arrow_table()
    section.blocks.append(TableBlock("GPUs by their largest idle cause", table,
                                     "mean idle share: the cause's share of those GPUs' idle time; mean idle of "
                                     "window share: their idle time as a share of their windows.")
                          if table.num_rows else NoteBlock("No GPU of the fleet sat idle with a cause to name."))
    return section


def _skew(con: duckdb.DuckDBPyConnection) -> Section:
    section = Section("fleet-skew", "Skew between ranks, by iteration",
                      "Within each group of ranks that ran the same iterations, each iteration's time on each rank "
                      "(the length of its step range), compared by iteration number, never by clock: the skew is "
                      "the slowest rank's time minus the fastest's, and the slowest rank is that iteration's "
                      "straggler.")
    skew = con.sql("SELECT * FROM skew").to_arrow_table()
    if not skew.num_rows:
        section.blocks.append(NoteBlock("No group has two ranks with iterations of the same number: nothing to "
                                        "compare (see the groups below, and docs/fleet.md on how groups are found)."))
        return section
    section.blocks.append(ChartBlock("fleet-skew", skew_chart(skew), "Each point is one iteration of one group, "
                                     "coloured by its straggler."))
    table = con.sql(f"""
        SELECT "group", world_size, iteration, ranks, fastest_ns, median_ns, slowest_ns, skew_ns, straggler_rank,
               straggler_capture
        FROM skew WHERE skew_ns > 0 ORDER BY skew_ns DESC, "group", iteration LIMIT {TOP_ROWS}""").to_arrow_table()
    section.blocks.append(TableBlock(f"The {table.num_rows} iterations of largest skew", table) if table.num_rows
                          else NoteBlock("In every iteration compared, every rank of its group took the same time."))
    return section


def _stragglers(con: duckdb.DuckDBPyConnection) -> Section:
    section = Section("fleet-stragglers", "Stragglers",
                      "Per group, the ranks that were the slowest in at least one iteration: how often, and how far "
                      "behind each iteration's median they ran on average.")
    table = con.sql(f"""
        SELECT "group", world_size, rank, capture, iterations, slowest, slowest_share, mean_behind_ns, max_skew_ns
        FROM stragglers WHERE slowest > 0
        ORDER BY slowest_share DESC, "group", rank LIMIT {TOP_ROWS}""").to_arrow_table()
    section.blocks.append(TableBlock("Ranks by how often they were the slowest", table) if table.num_rows
                          else NoteBlock("No rank was ever slower than the others of its group."))
    return section


def _groups(con: duckdb.DuckDBPyConnection) -> Section:
    section = Section("fleet-groups", "Groups of ranks",
                      "The ranks compared together: by default the captures in one folder with one world size (the "
                      "ranks of a capture whose ranks are its GPUs' device ids form a group of their own).")
    table = con.sql("SELECT * FROM groups").to_arrow_table()
    section.blocks.append(TableBlock("Groups", table) if table.num_rows else NoteBlock("No capture has a rank."))
    return section


def _failures(con: duckdb.DuckDBPyConnection) -> Section:
    section = Section("fleet-failures", "Failures", "Captures that did not go through, each with its error.")
    table = con.sql("SELECT capture, stage, error FROM failures").to_arrow_table()
    section.blocks.append(TableBlock(f"{table.num_rows} failed", table) if table.num_rows
                          else NoteBlock("Every capture went through."))
    return section


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")
