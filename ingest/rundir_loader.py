"""The loader for the engine's run directory: run.json and three Parquet logs into documented tables.

`iterations.parquet`, `events.parquet` and `requests.parquet` stream into `run_iterations`, `run_events`
and `run_requests` with their columns unchanged; `run.json` becomes the one-row `run_meta`. Everything
is checked before anything is written: a directory without run.json is an incomplete run (the engine
writes run.json last), and each file must be complete, carry the documented columns and hold as many
rows as run.json says it does.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from itertrace.errors import UserError, not_a_file
from itertrace.ingest.arrow_io import TableStream, parquet_table
from itertrace.ingest.loader import LoadContext, quote
from itertrace.ingest.run_schema import (EXTRA_COLUMN_DOC, META_COLUMNS, META_DOC, REQUIRED_META, RUN_FORMAT,
                                         RUN_JSON, RUN_TABLES, RunTable)
from itertrace.ingest.sqldoc import literal

if TYPE_CHECKING:
    import pyarrow as pa

# Files by which a folder is recognised as a run directory, complete or not (the engine writes
# `NAME.partial` and renames it when the run closes).
_MARKERS = tuple(name + suffix for name in (RUN_JSON, *(t.file_name for t in RUN_TABLES))
                 for suffix in ("", ".partial"))


@dataclass(frozen=True)
class RunDirLoader:
    """Loads one engine run directory per database."""

    kind: ClassVar[str] = "run"
    folders_only: ClassVar[bool] = True  # a run directory is never a single file
    accepts: ClassVar[str] = ("an itertrace run directory (run.json, iterations.parquet, events.parquet, "
                              "requests.parquet)")

    def claims(self, path: Path) -> bool:
        """True for a folder holding any file of a run directory, finished or partial."""
        return path.is_dir() and any((path / name).is_file() for name in _MARKERS)

    def check(self, paths: list[Path]) -> None:
        """Refuse more than one run, incomplete runs, and files that are missing, truncated or of another shape."""
        if len(paths) > 1:
            raise UserError(f"{paths[1]}: a database holds one run directory and {paths[0]} is already one; "
                            "ingest each run into its own database")
        for path in paths:
            meta = read_run_json(path)
            for spec in RUN_TABLES:
                check_table(path, spec, meta)

    def load(self, path: Path, ctx: LoadContext) -> None:
        """Stream the three logs into their tables and write run_meta, every column commented."""
        meta = read_run_json(path)
        tables = [(spec, _open(path / spec.file_name)) for spec in RUN_TABLES]
        ctx.progress.expect(sum(table.num_rows for _, table in tables))
        for spec, table in tables:
            ctx.write_table("main", table, spec.table)
            absent = _add_absent(ctx, spec, table.schema)
            _comment_table(ctx, spec, [*table.schema.names, *absent])
        _write_meta(ctx, path, meta, {spec.stem: table.num_rows for spec, table in tables})

    def finish(self, paths: list[Path], ctx: LoadContext) -> None:
        """Nothing to build across sources."""


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """run.json of `run_dir`, checked for the keys run_meta needs; UserError naming the file otherwise."""
    file = run_dir / RUN_JSON
    if (file.exists() or file.is_symlink()) and (why := not_a_file(file)):
        raise UserError(f"{file}: {why}")
    if not file.is_file():
        closing = (run_dir / f"{RUN_JSON}.partial").exists()
        partial = " (run.json.partial is there: the run did not close)" if closing else ""
        raise UserError(f"{file}: missing; {run_dir} is an incomplete run directory: the engine writes run.json "
                        f"last, when the run completes{partial}")
    try:
        meta = json.loads(file.read_bytes())
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})")
    except UnicodeDecodeError:
        raise UserError(f"{file}: not valid JSON (not UTF-8 text)")
    if not isinstance(meta, dict):
        raise UserError(f"{file}: expected a JSON object, found {type(meta).__name__}")
    found = meta.get("format")
    if found != RUN_FORMAT:
        newer = isinstance(found, str) and found.startswith("itertrace-run/")
        raise UserError(f"{file}: format {found!r}, expected {RUN_FORMAT!r}"
                        + ("; written by another version of itertrace" if newer else "; not an itertrace run.json"))
    missing = [key for key in REQUIRED_META if key not in meta]
    if missing:
        raise UserError(f"{file}: missing {', '.join(missing)}; not a complete itertrace run.json")
    wrong = [f"{key} is {type(meta[key]).__name__}, expected {kind.__name__}" for key, kind in REQUIRED_META.items()
             if not isinstance(meta[key], kind) or (kind is int and isinstance(meta[key], bool))]
    wrong += [f"{key} {meta[key]} does not fit a 64-bit integer" for key, kind in REQUIRED_META.items()
              if kind is int and not wrong and not -(2**63) <= meta[key] < 2**63]
    if wrong:
        raise UserError(f"{file}: {'; '.join(wrong)}")
    return meta


def check_table(run_dir: Path, spec: RunTable, meta: dict[str, Any]) -> None:
    """UserError unless `spec`'s file is present, readable, has its columns, and the row count run.json says."""
    table = _open(run_dir / spec.file_name)
    problems = []
    for column, (kind, _) in spec.columns.items():
        index = table.schema.get_field_index(column)
        if index < 0:
            if column not in spec.optional:
                problems.append(f"no column {column}")
        elif not kind.matches(table.schema.field(index).type):
            problems.append(f"column {column} is {table.schema.field(index).type}, expected {kind.value}")
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise UserError(f"{table.file}: {shown} (not the engine's {spec.stem} log)")
    counts = meta.get("tables")
    expected = counts.get(spec.stem) if isinstance(counts, dict) else None
    if isinstance(expected, int) and expected != table.num_rows:
        raise UserError(f"{table.file}: {table.num_rows} rows, but {RUN_JSON} says {expected}; "
                        "the files are not from one run")


def _open(file: Path) -> TableStream:
    if not file.exists() and not file.is_symlink():
        raise UserError(f"{file}: missing from the run directory")
    if why := not_a_file(file):
        raise UserError(f"{file}: {why}")
    if file.stat().st_size == 0:
        raise UserError(f"{file}: empty file, not a Parquet log")
    return parquet_table(file)


def _add_absent(ctx: LoadContext, spec: RunTable, schema: pa.Schema) -> list[str]:
    """Add the optional columns an older engine did not write, NULL throughout: every run table has them all."""
    absent = [name for name in spec.columns if name in spec.optional and schema.get_field_index(name) < 0]
    for name in absent:
        ctx.con.execute(f"ALTER TABLE {quote(spec.table)} ADD COLUMN {quote(name)} {spec.columns[name][0].sql_type}")
    return absent


def _comment_table(ctx: LoadContext, spec: RunTable, names: list[str]) -> None:
    ctx.con.execute(f"COMMENT ON TABLE {quote(spec.table)} IS {literal(spec.doc)}")
    for name in names:
        doc = spec.columns[name][1] if name in spec.columns else EXTRA_COLUMN_DOC.format(file=spec.file_name)
        ctx.con.execute(f"COMMENT ON COLUMN {quote(spec.table)}.{quote(name)} IS {literal(doc)}")


def _write_meta(ctx: LoadContext, run_dir: Path, meta: dict[str, Any], rows: dict[str, int]) -> None:
    scheduler = meta["config"].get("scheduler")
    scheduler = scheduler if isinstance(scheduler, dict) else {}
    values = {
        "run_id": hashlib.sha256((run_dir / RUN_JSON).read_bytes()).hexdigest()[:16],
        "run_name": run_dir.resolve().name,
        "source": str(run_dir.resolve()),
        "format": meta["format"],
        "runner": meta["runner"],
        "simulated": meta["simulated"],
        "device": meta["device"],
        "workload": meta["workload"],
        "seed": meta["seed"],
        "clock_source": meta["clock_source"],
        "clock_epoch_unix_ns": meta["clock_epoch_unix_ns"],
        "mode": _text(scheduler.get("mode")),
        "policy": _text(scheduler.get("policy")),
        "capacity": capacity if isinstance(capacity := scheduler.get("max_num_seqs"), int) and
        -(2**63) <= capacity < 2**63 else None,
        "python": _text(meta.get("python")),
        "platform": _text(meta.get("platform")),
        "iterations": rows["iterations"],
        "events": rows["events"],
        "requests": rows["requests"],
        "config_json": _json(meta["config"]),
        "versions_json": _json(meta["versions"]),
        "summary_json": _json(meta["summary"]) if meta.get("summary") is not None else None,
    }
    columns = ", ".join(f"{quote(name)} {kind}" for name, kind, _ in META_COLUMNS)
    ctx.con.execute(f"CREATE TABLE run_meta ({columns})")
    ctx.con.execute(f"INSERT INTO run_meta VALUES ({', '.join('?' * len(META_COLUMNS))})",
                    [values[name] for name, _, _ in META_COLUMNS])
    ctx.rows_written += 1
    ctx.con.execute(f"COMMENT ON TABLE run_meta IS {literal(META_DOC)}")
    for name, _, doc in META_COLUMNS:
        ctx.con.execute(f"COMMENT ON COLUMN run_meta.{quote(name)} IS {literal(doc)}")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
