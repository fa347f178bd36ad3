"""The loader for PyTorch profiler (Kineto) traces: Chrome-trace JSON, gzipped or not, one file per rank.

Each file's event array is split out (`kineto_json`) and streamed by DuckDB's JSON reader into a staging
table; when every file is in, the normalized tables (created from their own definitions in `sql/`) are
filled from it by `sql/kineto.sql`, beside tables of Kineto's own: `kineto_sources` (one row per file:
rank, world size, schema version, metadata), `kineto_devices`, `kineto_cpu_ops`, `kineto_gpu_annotations`.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import duckdb

from itertrace.errors import UserError
from itertrace.ingest.arrow_io import first_line
from itertrace.ingest.kineto_checks import check_base_time, check_time_range, leave_out
from itertrace.ingest.kineto_json import looks_like_trace, split_trace
from itertrace.ingest.kineto_nesting import create_kineto_nesting
from itertrace.ingest.loader import EventCount, LoadContext
from itertrace.ingest.normalize import SQL_FILES, normalized_tables, sql_text
from itertrace.ingest.plans import prefer_sort_based_joins
from itertrace.ingest.sqldoc import comment_statements, literal, statements

SUFFIXES = (".json", ".json.gz")
MAX_SOURCES = 32767  # source_no takes the top 16 bits of a global id, below the sign bit
API_CATS = ("cuda_runtime", "runtime", "cuda_driver", "driver")
GPU_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset")
# What each shared table holds when it comes from Kineto traces (their columns keep their own comments).
TABLE_NOTES = {
    "capture_meta": "The PyTorch profiler traces this database holds: one row per trace file (kineto_sources).",
    "threads": "CPU threads of the PyTorch profiler traces; global ids carry the file's kineto_sources.source_no "
               "in bits 48 and up, so ranks never share one.",
    "processes": "Processes of the PyTorch profiler traces: one per (file, pid).",
    "nvtx_ranges": "Annotation ranges of the PyTorch profiler traces (cat user_annotation: torch.profiler."
                   "record_function ranges) and their Python stack frames (cat python_function, range_kind "
                   "'python_frame'), nested together per thread; int64_value is a range's one integer argument.",
    "nvtx_marks": "Instant events on CPU threads of the PyTorch profiler traces (ph i).",
    "cuda_api": "Runtime and driver calls of the PyTorch profiler traces (cat cuda_runtime, cuda_driver).",
    "gpu_ops": "Kernels, copies and sets of the PyTorch profiler traces (cat kernel, gpu_memcpy, gpu_memset), "
               "each tied to the process whose runtime call launched it.",
}


@dataclass(frozen=True)
class KinetoLoader:
    """Loads PyTorch profiler traces, any number of them (one per rank) into one database."""

    kind: ClassVar[str] = "kineto"
    accepts: ClassVar[str] = "a PyTorch profiler trace (.json or .json.gz, as torch.profiler writes it)"

    def claims(self, path: Path) -> bool:
        """True for a .json or .json.gz file."""
        return path.is_file() and path.name.endswith(SUFFIXES)

    def check(self, paths: list[Path]) -> None:
        """Refuse a file given twice, too many files, and files that cannot be Chrome-trace JSON."""
        if len(paths) > MAX_SOURCES:
            raise UserError(f"{len(paths):,} trace files: a database holds at most {MAX_SOURCES:,}")
        seen: dict[Path, Path] = {}
        for path in paths:
            if (earlier := seen.setdefault(path.resolve(), path)) is not path:
                raise UserError(f"{path}: given twice (also as {earlier})")
            if why := looks_like_trace(path):
                raise UserError(f"{path}: {why}")

    def load(self, path: Path, ctx: LoadContext) -> None:
        """Stage the file's events and remember its top-level keys."""
        con = ctx.con
        source_no = con.execute(_sql().next_source).fetchall()[0][0]
        if source_no == 1:
            con.execute(_sql().stage_create)
        events_file = ctx.workdir / f"kineto-{source_no}.events.json"
        ctx.progress.phase(f"reading {path.name}")
        split = split_trace(path, events_file)
        try:
            check_base_time(path, split.meta)
            staged = con.execute(_sql().stage_insert, [str(events_file), source_no]).fetchall()[0][0]
        except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
            message = first_line(exc).split(" Error: ", 1)[-1]
            message = message.replace(f'in file "{events_file}"', "in traceEvents").replace(str(events_file), "traceEvents")
            raise UserError(f"{path}: not a readable trace ({message})") from None
        finally:
            events_file.unlink(missing_ok=True)
        if not staged:
            raise UserError(f"{path}: no trace events (no element of traceEvents has a ph field)")
        con.execute("INSERT INTO _kineto_files VALUES (?, ?, ?)",
                    [source_no, str(path.resolve()), json.dumps(split.meta, default=str)])

    def finish(self, paths: list[Path], ctx: LoadContext) -> None:
        """Build the normalized tables and Kineto's own from every staged file.

        The statements go to DuckDB a script at a time (the CREATEs, the INSERTs, the COMMENTs), read
        from the SQL files once per process. Most of the time of a small trace goes to DuckDB itself
        (benchmarks/bench_kineto.py --floor): planning each INSERT, about 170 COMMENTs, the checkpoint.
        """
        con = ctx.con
        sql = _sql()
        _refuse_other_captures(con, paths[0])
        ctx.progress.phase("building the normalized tables from the traces")
        prefer_sort_based_joins(con)
        sources = _sources(con)
        con.execute(sql.creates)
        _write_sources(con, sources)  # counts every event of each file, those left out next included
        ctx.notes.extend(leave_out(con, paths))
        _align_clocks(con, sources, paths)
        _correlate_by_flows(con)
        con.execute(sql.before_nesting)
        create_kineto_nesting(con, "SELECT * FROM _kineto_nesting_input", "_kineto_nesting")
        con.execute(sql.after_nesting)
        ctx.event_counts += [EventCount(*row) for row in con.execute(
            "SELECT category, events, kept_in, skipped_why FROM _kineto_event_fates").fetchall()]
        _check_ids(con, paths)
        _write_capture_meta(con, sources)
        con.execute(sql.comments)
        ctx.rows_written += con.execute(sql.count_rows).fetchall()[0][0]
        con.execute("DROP TABLE _kineto_annotations; DROP TABLE _kineto_nesting; DROP VIEW _kineto_nesting_input; "
                    "DROP TABLE _kineto_event_fates; DROP TABLE _kineto_left_out; DROP TABLE _kineto_threads; "
                    "DROP TABLE _kineto_events; "
                    "DROP TABLE _kineto_files")


@dataclass(frozen=True)
class _Source:
    """One staged trace file and what its top-level keys say."""

    source_no: int
    source: str
    meta: dict[str, Any]

    @property
    def base_time_ns(self) -> int | None:
        return _int(self.meta.get("baseTimeNanoseconds"))

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.meta.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    @property
    def range_domain(self) -> str | None:
        domain = self._declared().get("domain")
        return domain if isinstance(domain, str) and domain else None

    @property
    def mark_names(self) -> list[str]:
        marks = self._declared().get("marks")
        return [m for m in marks if isinstance(m, str)] if isinstance(marks, list) else []

    def _declared(self) -> dict[str, Any]:
        """The trace's top-level `itertrace` object, as `itertrace run --torch-profile` writes it."""
        declared = self.meta.get("itertrace")
        return declared if isinstance(declared, dict) else {}


@dataclass(frozen=True)
class _Sql:
    """The ingest's SQL, read and split once per process, as the scripts `finish` runs."""

    next_source: str  # the number of the file about to be staged (it creates the table of files)
    stage_create: str  # the staging table of events, and the macros its insert uses
    stage_insert: str  # one file's events into the staging table (parameters: events file, source number)
    creates: str  # every table the ingest fills, normalized and Kineto's own
    before_nesting: str  # kineto.sql's statements other than its CREATE TABLEs, up to the nesting (kineto_nesting.py)
    after_nesting: str  # and those after it
    comments: str  # COMMENT ON for every table and column, and TABLE_NOTES
    count_rows: str  # one query: the rows of every table filled


@functools.cache
def _sql() -> _Sql:
    stage = statements(sql_text("kineto_stage.sql"))  # the table and its macros, then the insert
    own = statements(sql_text("kineto.sql"))
    shared_creates = [s for name in SQL_FILES for s in statements(sql_text(name)) if _is_create_table(s)]
    own_creates = [s for s in own if _is_create_table(s)]
    own_tables = tuple(_code(s).split()[2] for s in own_creates)
    comments = [s for name in (*SQL_FILES, "kineto.sql") for s in comment_statements(sql_text(name))]
    comments += [f"COMMENT ON TABLE {table} IS {literal(note)}" for table, note in TABLE_NOTES.items()]
    inserts = [s for s in own if s not in own_creates]
    split = next(i for i, s in enumerate(inserts) if "_kineto_nesting " in _code(s))
    counts = " + ".join(f"(SELECT count(*) FROM {table})" for table in (*normalized_tables(), *own_tables))
    return _Sql(next_source="CREATE TEMP TABLE IF NOT EXISTS _kineto_files (source_no INTEGER, source VARCHAR, "
                            "meta JSON); SELECT count(*) + 1 FROM _kineto_files",
                stage_create=_script(stage[:-1]), stage_insert=stage[-1], creates=_script(shared_creates + own_creates),
                before_nesting=_script(inserts[:split]), after_nesting=_script(inserts[split:]),
                comments=_script(comments),
                count_rows=f"SELECT {counts}")


def _script(parts: list[str]) -> str:
    return ";\n".join(parts) + ";"


def _code(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--")).strip()


def _is_create_table(statement: str) -> bool:
    """A CREATE TABLE, or a CREATE VIEW over tables (nvtx_ranges over _nvtx_range_rows); not a temp one."""
    return _code(statement).startswith(("CREATE TABLE ", "CREATE VIEW "))


def _refuse_other_captures(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """An nsys capture fills the same tables: the two cannot share a database."""
    names = {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() UNION ALL "
        "SELECT 'schema ' || schema_name FROM duckdb_schemas() WHERE database_name = current_database()").fetchall()}
    if names & set(normalized_tables()) or "schema nsys" in names:
        raise UserError(f"{path}: a database holds nsys captures or PyTorch profiler traces, not both; "
                        "ingest each into its own database")


def _sources(con: duckdb.DuckDBPyConnection) -> list[_Source]:
    rows = con.execute("SELECT source_no, source, meta FROM _kineto_files ORDER BY source_no").fetchall()
    return [_Source(no, source, json.loads(meta)) for no, source, meta in rows]


def _time_shifts(sources: list[_Source]) -> dict[int, int]:
    """What to add to each file's times so that all count from the earliest one's base time.

    A file without baseTimeNanoseconds (an older trace) counts in Unix time, as if its base were 0.
    """
    bases = {s.source_no: s.base_time_ns or 0 for s in sources}
    start = min(bases.values())
    return {no: base - start for no, base in bases.items()}


def _align_clocks(con: duckdb.DuckDBPyConnection, sources: list[_Source], paths: list[Path]) -> None:
    shifts = _time_shifts(sources)
    check_time_range(con, shifts, paths)
    for source_no, shift in shifts.items():
        if shift:
            con.execute("UPDATE _kineto_events SET ts_ns = ts_ns + ? WHERE source_no = ?", [shift, source_no])


def _correlate_by_flows(con: duckdb.DuckDBPyConnection) -> None:
    """Where a runtime call or GPU operation carries no correlation id (older traces), take the id of the
    flow event (cat ac2g, async_cpu_to_gpu, async_gpu) that starts at the call or ends at the operation."""
    missing = con.execute(
        f"SELECT count(*) FROM _kineto_events WHERE ph = 'X' AND correlation_id IS NULL AND cat IN {API_CATS + GPU_CATS}"
    ).fetchall()[0][0]
    if not missing:
        return
    for flow_ph, cats in (("s", API_CATS), ("f", GPU_CATS)):
        con.execute(f"""
            UPDATE _kineto_events AS e SET correlation_id = f.flow_id
            FROM (SELECT source_no, pid, tid, ts_ns, min(flow_id) AS flow_id FROM _kineto_events
                  WHERE ph = '{flow_ph}' AND cat IN ('ac2g', 'async_cpu_to_gpu', 'async_gpu') AND flow_id IS NOT NULL
                  GROUP BY ALL) AS f
            WHERE e.ph = 'X' AND e.correlation_id IS NULL AND e.cat IN {cats}
              AND f.source_no = e.source_no AND f.pid = e.pid AND f.tid = e.tid AND f.ts_ns = e.ts_ns""")


def _write_sources(con: duckdb.DuckDBPyConnection, sources: list[_Source]) -> None:
    shifts = _time_shifts(sources)
    counts: dict[int, dict[str, int]] = {}
    for source_no, cat, n in con.execute(
            "SELECT source_no, coalesce(cat, ph), count(*) FROM _kineto_events GROUP BY ALL ORDER BY 1, 3 DESC, 2"
    ).fetchall():
        counts.setdefault(source_no, {})[cat] = n
    rows: list[list[Any]] = []
    for s in sources:
        info = s.distributed
        meta = {k: v for k, v in s.meta.items() if k not in ("deviceProperties", "distributedInfo")}
        by_cat = counts.get(s.source_no, {})
        con.execute("INSERT INTO kineto_sources VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            s.source_no, s.source, _int(info.get("rank")), _int(info.get("world_size")), _text(info.get("backend")),
            _text(s.meta.get("schemaVersion")), _text(s.meta.get("displayTimeUnit")), s.base_time_ns,
            shifts[s.source_no], s.range_domain, s.mark_names, sum(by_cat.values()), json.dumps(by_cat),
            json.dumps(info) if info else None, json.dumps(meta, default=str)])
        devices = s.meta.get("deviceProperties")
        rows += [[s.source_no, _int(d.get("id")), _text(d.get("name")), _int(d.get("totalGlobalMem")),
                  _capability(d), _int(d.get("numSms")), json.dumps(d)]
                 for d in (devices if isinstance(devices, list) else []) if isinstance(d, dict)]
    if rows:
        con.executemany("INSERT INTO kineto_devices VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def _capability(device: dict[str, Any]) -> str | None:
    major, minor = device.get("computeMajor"), device.get("computeMinor")
    return f"{major}.{minor}" if major is not None else None


def _write_capture_meta(con: duckdb.DuckDBPyConnection, sources: list[_Source]) -> None:
    """A row per file; every time in the database counts from the earliest base time (NULL where no file has one)."""
    start = min(s.base_time_ns or 0 for s in sources) if any(s.base_time_ns is not None for s in sources) else None
    for s in sources:
        con.execute("INSERT INTO capture_meta VALUES (?, 'kineto', NULL, ?, ?, "
                    "strftime(make_timestamp(?::BIGINT // 1000), '%Y-%m-%dT%H:%M:%S'), NULL)",
                    [s.source, _text(s.meta.get("schemaVersion")), start, start])


def _check_ids(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> None:
    """Global ids hold pid and tid in 24 bits each: refuse a trace whose ids would collide."""
    clash = con.execute("""
        SELECT source_no, pid, tid FROM _kineto_threads
        WHERE global_tid IN (SELECT global_tid FROM _kineto_threads GROUP BY global_tid HAVING count(*) > 1)
        ORDER BY ALL LIMIT 1""").fetchall()
    if clash:
        source_no, pid, tid = clash[0]
        raise UserError(f"{paths[source_no - 1]}: thread {tid} of process {pid} has an id beyond 24 bits that "
                        "collides with another thread's")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
