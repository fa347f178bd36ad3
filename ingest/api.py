"""`ingest`: sources of every known kind into one DuckDB file, built aside and renamed into place at the end.

Each source goes to the first loader that claims it, and every source is checked before anything is
written. The database is built in a temporary file beside the target and renamed onto it at the end,
so a failed ingest leaves no file behind and an existing database untouched.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from itertrace.errors import UserError, not_a_file
from itertrace.interrupts import deferred, interruptible, quiet_progress
from itertrace.ingest.arrow_io import first_line
from itertrace.ingest.kineto import KinetoLoader
from itertrace.ingest.checks import empty_tables, unnamed_threads_note
from itertrace.ingest.loader import EventCount, LoadContext, Loader
from itertrace.ingest.normalize import normalized_tables
from itertrace.ingest.nsys_loader import RAW_SCHEMA, NsysLoader
from itertrace.ingest.progress import Progress
from itertrace.ingest.rundir_loader import RunDirLoader
from itertrace.targets import (Kind, check_not_held, hidden, hidden_folder, is_kind, remove_leftovers, replaceable,
                               write_failure)

# Files this DuckDB writes can be opened by DuckDB 1.2 and newer, not only by the writing version (1.2 brought
# ZSTD for text and Roaring for NULL masks, which keep a small capture's database small).
STORAGE_COMPATIBILITY = "v1.2.0"
# The least --memory-limit taken: 20 MB ran out of memory on a real 2-GPU export of 30k rows, 50 MB did not.
MIN_MEMORY_LIMIT = 64 << 20
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]i?b|b|bytes)?\s*", re.IGNORECASE)
_UNITS = {"b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}
# DuckDB gives every table at least one block: 64 KiB blocks instead of its 256 KiB keep a small capture's
# database small, and still let it bit-pack integers (which it does not in blocks of 32 KiB or less).
# DuckDB 1.0 reads only 256 KiB blocks; 1.1 and newer read any size.
BLOCK_SIZE = 65_536
# DuckDB's own default is 80% of the machine's memory; an ingest spills to disk beyond this instead
# (benchmarks/bench_ingest.py measures the peak memory it gives).
DEFAULT_MEMORY_LIMIT = "512MB"
# DuckDB flushes its allocator's cached memory back to the OS after a bulk free larger than this. Its default,
# 512 MiB, is the whole default limit: the memory one statement freed stayed resident into the next, and the
# 10M-row benchmark capture peaked at 1,020-1,025 MB instead of 919-926 MB, in the same time.
BULK_FREE_FLUSH = "64MB"


@dataclass(frozen=True)
class IngestOptions:
    """Settings of one ingest."""

    batch_rows: int = 65_536  # rows per record batch handed to DuckDB: bounds the memory a table takes
    memory_limit: str | None = None  # DuckDB's memory_limit, e.g. "2GB"; None: DEFAULT_MEMORY_LIMIT
    threads: int | None = None  # DuckDB worker threads; None keeps DuckDB's default


@dataclass(frozen=True)
class IngestResult:
    """What an ingest wrote: the database, the sources and their kinds, rows, and time taken."""

    db: Path
    sources: tuple[Path, ...]
    kinds: tuple[str, ...]
    rows: int
    seconds: float
    notes: tuple[str, ...] = ()  # what looks wrong but may be meant (a run and a capture that look like two runs)
    empty: tuple[str, ...] = ()  # normalized tables that came out with no rows (their sources were absent or empty)
    event_counts: tuple[EventCount, ...] = ()  # the trace events read, by category, and what became of them

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def default_loaders(nsys_executable: str | Path | None = None) -> list[Loader]:
    """The loaders `ingest` uses unless given others, narrowest kind first.

    A run directory holds Parquet files as a parquetdir export does, so its loader goes first.
    """
    return [RunDirLoader(), NsysLoader(nsys_executable), KinetoLoader()]


def ingest(
    sources: Sequence[str | Path],
    db: str | Path,
    *,
    loaders: Sequence[Loader] | None = None,
    options: IngestOptions = IngestOptions(),
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    finish: Callable[[duckdb.DuckDBPyConnection, Path, int], object] | None = None,
) -> IngestResult:
    """Load every source into a new DuckDB database at `db`, replacing any file there only on success.

    `finish(connection, path, rows)`, if given, runs on the database when it is loaded and before it is
    written whole, e.g. to store answers of the queries in it (itertrace.queries.stored)."""
    started = clock()
    target = Path(db)
    paths = [Path(source) for source in sources]
    chosen = list(loaders) if loaders is not None else default_loaders()
    plan = [(path, _loader_for(path, chosen)) for path in paths]
    groups = _group(plan)
    for loader, claimed in groups:
        loader.check(claimed)
    target = _check_target(target, paths)
    remove_leftovers(target)  # of ingests killed before they could clean up
    progress = progress if progress is not None else Progress(enabled=False)
    building = hidden(target, "ingest")
    _remove_database(building)
    try:
        workdir = hidden_folder(target, "work")
        try:
            con = _connect(building, options)
            try:
                with interruptible(con):  # Ctrl-C and SIGTERM reach DuckDB inside a long statement too
                    ctx = LoadContext(con, workdir, options.batch_rows, progress)
                    after = None if finish is None else lambda c, rows: finish(c, building, rows)
                    rows, notes, empty, tables = _load(con, plan, groups, ctx, after)
            finally:
                with deferred():  # see itertrace.interrupts: clean-up is not broken into
                    con.close()
            _check_complete(building, tables)
            check_not_held(target)  # again: the ingest took a while
            os.replace(building, target)
        finally:
            with deferred():
                shutil.rmtree(workdir, ignore_errors=True)
        target.with_name(target.name + ".wal").unlink(missing_ok=True)  # a log of the database replaced
    except BaseException as exc:
        with deferred():
            _remove_database(building)
        if isinstance(exc, duckdb.OutOfMemoryException):
            limit = (f"--memory-limit {options.memory_limit}" if options.memory_limit
                     else f"the default --memory-limit {DEFAULT_MEMORY_LIMIT}")
            where = f"{exc.source}: " if hasattr(exc, "source") else ""
            raise UserError(f"{where}DuckDB ran out of memory under {limit} ({first_line(exc)}); "
                            f"give it more with --memory-limit; {target} is unchanged") from None
        if why := write_failure(exc):
            kept = "the database there is unchanged" if target.exists() else "nothing was written"
            raise UserError(f"{target}: cannot write the database in {target.parent} ({why}); {kept}") from None
        raise
    finally:
        progress.close()
    kinds = tuple(loader.kind for _, loader in plan)
    return IngestResult(target, tuple(paths), kinds, rows, clock() - started, notes, empty, tuple(ctx.event_counts))


def _load(con: duckdb.DuckDBPyConnection, plan: list[tuple[Path, Loader]], groups: list[tuple[Loader, list[Path]]],
          ctx: LoadContext, finish: Callable[[duckdb.DuckDBPyConnection, int], object] | None = None,
          ) -> tuple[int, tuple[str, ...], tuple[str, ...], int]:
    """Load every source in one transaction, then `finish`, checkpointed into the file: (rows, notes, empty tables,
    tables)."""
    con.begin()  # one transaction: the temporary file already makes the ingest all-or-nothing
    for path, loader in plan:
        try:
            loader.load(path, ctx)
        except duckdb.OutOfMemoryException as exc:
            exc.source = path  # the ingest's message names the source that ran it out
            raise
    for loader, claimed in groups:
        loader.finish(claimed, ctx)
    con.commit()
    notes = tuple(n for n in (*ctx.notes, _pairing_note(con), unnamed_threads_note(con, RAW_SCHEMA)) if n)
    empty = tuple(empty_tables(con, normalized_tables()))
    if finish is not None:
        finish(con, ctx.rows_written)
    tables = _table_count(con)
    con.execute("CHECKPOINT")  # everything into the file itself: a full disk fails here, not at close
    return ctx.rows_written, notes, empty, tables


def _pairing_note(con: duckdb.DuckDBPyConnection) -> str | None:
    """A run directory ingested beside a capture should be the run that capture recorded: a note when the
    two look like different runs (the comparison views would then compare unrelated requests).

    The capture's `step` ranges number the run log's iterations, and on a wall clock last as long as
    them (within NVTX overhead: 18 us median on the sample traces' 4-8 ms iterations); a capture may
    cover part of a run (a capture range), so fewer steps alone are no sign.
    """
    tables = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables() UNION ALL "
                                              "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    if not {"run_iterations", "run_meta", "nvtx_ranges"} <= tables:
        return None
    steps, iterations, matched, differ, clock = con.execute("""
        WITH steps AS (
          SELECT int64_value AS iteration, end_ns - start_ns AS dur_ns FROM nvtx_ranges
          WHERE text = 'step' AND domain_name = 'itertrace' AND int64_value IS NOT NULL)
        SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM run_iterations), count(i.iteration),
               avg((abs(s.dur_ns - i.dur_ns) > 0.05 * i.dur_ns + 100000)::INTEGER),
               (SELECT any_value(clock_source) FROM run_meta)
        FROM steps AS s LEFT JOIN run_iterations AS i USING (iteration)""").fetchone()
    if not steps:
        return None  # not this engine's capture: nothing to match
    if matched < steps:
        return (f"{steps - matched:,} of the capture's {steps:,} step ranges number iterations the run log "
                f"does not have ({iterations:,} iterations): the run directory looks like another run's")
    if clock == "simulated":  # virtual time: durations say nothing, but a simulated run is captured whole
        if steps != iterations:
            return (f"the capture has {steps:,} step ranges and the simulated run log {iterations:,} iterations: "
                    "the run directory looks like another run's")
        return None
    if differ > 0.5:  # the same iteration, timed twice: apart by NVTX overhead, tens of us
        return (f"{differ:.0%} of the capture's step ranges differ in length from the run log's iteration of "
                "the same number by over 5% + 0.1 ms: the run directory looks like another run's")
    return None


def _loader_for(path: Path, loaders: Sequence[Loader]) -> Loader:
    if not path.exists():  # a symbolic link to nothing, or one that loops, says so
        raise UserError(f"{path}: {not_a_file(path) if path.is_symlink() else 'no such file or folder'}")
    if not path.is_dir() and (why := not_a_file(path, "file or folder")):  # a FIFO: never opened
        raise UserError(f"{path}: {why}")
    for loader in loaders:
        if loader.claims(path):
            return loader
    if path.is_file():  # what takes files first: a folder-only kind is the last thing to suggest for a file
        loaders = sorted(loaders, key=lambda loader: getattr(loader, "folders_only", False))
    expected = "; or ".join(loader.accepts for loader in loaders)
    if path.is_dir():
        what = "folder is empty" if not any(path.iterdir()) else "folder holds no tables that itertrace recognises"
        raise UserError(f"{path}: {what}; expected {expected}")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: empty file of unknown type; expected {expected}")
    raise UserError(f"{path}: unknown source type{f' {path.suffix!r}' if path.suffix else ''}; expected {expected}")


def _group(plan: list[tuple[Path, Loader]]) -> list[tuple[Loader, list[Path]]]:
    groups: list[tuple[Loader, list[Path]]] = []
    for path, loader in plan:
        for known, claimed in groups:
            if known is loader:
                claimed.append(path)
                break
        else:
            groups.append((loader, [path]))
    return groups


def _check_target(target: Path, sources: list[Path]) -> Path:
    """The database file to write: a path `--db` may replace, and none of the sources."""
    if not sources:
        raise UserError("no sources to ingest")
    if any(target.resolve() == source.resolve() for source in sources):
        raise UserError(f"{target}: the database would overwrite one of the sources")
    for source in sources:  # a file inside a source folder, e.g. a run's events.parquet, is a source too
        if source.is_dir() and source.resolve() in target.resolve().parents and target.is_file() and \
                not is_kind(target, Kind.DATABASE):
            raise UserError(f"{target}: the database would overwrite a file of the source {source}")
    return replaceable(target, Kind.DATABASE, "--db")


def _table_count(con: duckdb.DuckDBPyConnection) -> int:
    return con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()").fetchall()[0][0]


def _check_complete(path: Path, tables: int) -> None:
    """That the database closed at `path` is whole in its file (no log left to replay) and holds `tables`
    tables, before it replaces anything."""
    wal = path.with_name(path.name + ".wal")
    if wal.exists() and wal.stat().st_size:
        raise UserError(f"{path}: DuckDB left {wal.stat().st_size:,} bytes of its log unwritten to the database")
    with duckdb.connect(str(path), read_only=True) as con:
        found = _table_count(con)
    if found != tables:
        raise UserError(f"{path}: the database written holds {found} tables, not {tables}")


def _connect(path: Path, options: IngestOptions) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | int] = {"storage_compatibility_version": STORAGE_COMPATIBILITY,
                                    "default_block_size": str(BLOCK_SIZE),
                                    "allocator_bulk_deallocation_flush_threshold": BULK_FREE_FLUSH}
    if options.memory_limit:
        limit = memory_bytes(options.memory_limit)
        if limit is not None and limit < MIN_MEMORY_LIMIT:
            raise UserError(f"--memory-limit {options.memory_limit}: below the {MIN_MEMORY_LIMIT >> 20} MiB an ingest "
                            "needs at least (DuckDB works in blocks of 256 KiB per thread and table)")
    config["memory_limit"] = options.memory_limit or DEFAULT_MEMORY_LIMIT
    if options.threads:
        config["threads"] = options.threads
    try:
        con = duckdb.connect(str(path), config=config)
        quiet_progress(con)  # ours is on stderr
        return con
    except (duckdb.InvalidInputException, duckdb.ParserException) as exc:  # e.g. a memory limit it cannot parse
        if options.memory_limit and memory_bytes(options.memory_limit) is None:  # the one setting a user gives
            raise UserError(f"--memory-limit {options.memory_limit}: not a size, such as 512MB or 2GB "
                            f"({first_line(exc)})") from None
        settings = ", ".join(f"{key}={value}" for key, value in config.items())
        raise UserError(f"DuckDB refused the settings {settings} ({first_line(exc)})")


def memory_bytes(text: str) -> int | None:
    """A size such as 2GB, 512MiB or 100000000 bytes in bytes (units as DuckDB reads them); None for other forms."""
    found = _SIZE.fullmatch(text)
    return int(float(found.group(1)) * _UNITS[(found.group(2) or "b").lower()]) if found else None


def _remove_database(path: Path) -> None:
    for leftover in (path, path.with_name(path.name + ".wal")):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(path.with_name(path.name + ".tmp"), ignore_errors=True)
