"""The report: a run's, or several runs', charts and key tables, gathered from their databases.

`build_report` opens each database with the query library, keeps the sections whose source tables
the databases hold (a simulated run has no trace: its gap sections become a note) and returns a
`Report` of charts and tables; `write_report` (in html.py) turns it into one self-contained page.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from itertrace.dashboards.banner import mapping_line
from itertrace.dashboards.blocks import Report, RunData
from itertrace.dashboards.sections import sections
from itertrace.dashboards.time_axis import capture_start_ns
from itertrace.errors import UserError
from itertrace.queries.api import QueryDB
from itertrace.queries.library import NOT_INGESTED
from itertrace.queries.catalog import SOURCE_TABLES

def build_report(dbs: Sequence[str | Path], labels: Sequence[str] | None = None, *, title: str | None = None,
                 params: dict[str, str] | None = None, memory_limit: str | None = None) -> Report:
    """The report of one database, or the comparison of several (labelled by `labels`, else from their runs).

    `params` are the query library's parameters for every database, e.g. the generic mapping's.
    """
    if not dbs:
        raise UserError("report: give at least one --db FILE")
    if labels and len(labels) != len(dbs):
        raise UserError(f"report: {len(labels)} --label for {len(dbs)} --db; give one label per database, in order")
    runs = _open(dbs, labels, params or {}, memory_limit)
    try:
        names = " vs ".join(r.label for r in runs) if len(runs) <= 2 else f"{len(runs)} runs compared"
        mappings = tuple((f"{r.label}: " if len(runs) > 1 else "") + r.mapping_note for r in runs if r.mapping_note)
        return Report(title=title or f"itertrace report: {names}", meta=_meta_table(runs),
                      simulated=tuple(r.label for r in runs if r.meta and r.meta.get("simulated")),
                      sections=tuple(sections(runs)), mappings=mappings)
    finally:
        for run in runs:
            run.db.close()


def _open(dbs: Sequence[str | Path], labels: Sequence[str] | None, params: dict[str, str],
          memory_limit: str | None = None) -> list[RunData]:
    """Each database opened with the query library, with what it holds and its run's label."""
    runs: list[RunData] = []
    try:
        for path in dbs:
            db = QueryDB(path, params, memory_limit=memory_limit)
            if len(db.missing) == len(SOURCE_TABLES):
                db.close()
                raise UserError(f"{path}: {NOT_INGESTED}; nothing to report")
            if "nvtx_ranges" not in db.missing:
                db.sql("SELECT * FROM mapping")  # an incomplete mapping fails here, in one line
            capture = _one_row(db, "capture_meta")
            runs.append(RunData("", Path(path), db, _one_row(db, "run_meta"), capture, 0,
                                mapping_note=mapping_line(db, Path(path), capture.get("source_kind"))
                                if capture else None,
                                start_ns=capture_start_ns(db) if capture else 0))
            if "nvtx_ranges" not in db.missing:
                runs[-1].iterations_in_trace = int(db.sql("SELECT count(*) AS n FROM iterations").column(0)[0].as_py())
                runs[-1].gpu_ops = int(db.sql("SELECT count(*) AS n FROM gpu_ops").column(0)[0].as_py())
        for run, label in zip(runs, labels or _default_labels(runs)):
            run.label = label
        seen = [r.label for r in runs]
        if len(set(seen)) != len(seen):
            raise UserError(f"report: labels must differ, got {', '.join(seen)}")
    except BaseException:
        for run in runs:
            run.db.close()
        raise
    return runs


def _one_row(db: QueryDB, table: str) -> dict | None:
    if table not in db.tables():
        return None
    rows = db.sql(f"SELECT * FROM {table} LIMIT 1").to_pylist()
    return rows[0] if rows else None


def _default_labels(runs: list[RunData]) -> list[str]:
    """Labels from what differs between the runs (workload, mode, policy), else run names, else file names."""
    def field_of(run: RunData, key: str) -> str:
        return str((run.meta or {}).get(key) or "")

    if len(runs) == 1:
        run = runs[0]
        return [" ".join(x for x in (field_of(run, "workload"), field_of(run, "mode"), field_of(run, "policy")) if x)
                or run.path.stem]
    differing = [k for k in ("workload", "mode", "policy") if len({field_of(r, k) for r in runs}) > 1]
    for candidate in ([" ".join(field_of(r, k) for k in differing) for r in runs] if differing else [],
                      [field_of(r, "run_name") for r in runs], [r.path.stem for r in runs],
                      [str(r.path) for r in runs]):
        if candidate and all(candidate) and len(set(candidate)) == len(candidate):
            return candidate
    return [f"{r.path.stem} ({i + 1})" for i, r in enumerate(runs)]


_META_FIELDS = ("workload", "mode", "policy", "capacity", "runner", "device", "iterations", "requests", "seed")


def _meta_table(runs: list[RunData]) -> pa.Table:
    """One row per run: whether its times were measured or simulated first, then what it ran, then its files."""
    rows = []
    for r in runs:
        meta = r.meta or {}
        row = {"run": r.label,
               "times": ("SIMULATED: cost model" if meta.get("simulated") else "measured") if r.meta else "no run log"}
        row.update({k: meta.get(k) for k in _META_FIELDS})
        tool = (f"nsys {r.capture.get('nsys_version')}" if r.capture.get("nsys_version") else r.capture.get("source_kind")
                ) if r.capture else None
        row["capture"] = (f"{tool}, {r.iterations_in_trace:,} iterations" if r.capture and r.has_trace
                          else f"{tool}, no iterations" if r.capture else "none")
        row["run name"] = meta.get("run_name")
        row["database"] = str(r.path)
        rows.append(row)
    return pa.Table.from_pylist(rows)
