"""`ingest`: sources of every known kind into one DuckDB file, built aside and renamed into place at the end.

Each source goes to the first loader that claims it, and every source is checked before anything is
written. The database is built in a temporary file beside the target and renamed onto it at the end,
so a failed ingest leaves no file behind and an existing database untouched.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from itertrace.errors import UserError, no_folder_for
from itertrace.ingest.arrow_io import first_line
from itertrace.ingest.loader import LoadContext, Loader
from itertrace.ingest.nsys_loader import NsysLoader
from itertrace.ingest.progress import Progress
from itertrace.ingest.rundir_loader import RunDirLoader

# Files this DuckDB writes can be opened by DuckDB 1.1 and newer, not only by the writing version.
STORAGE_COMPATIBILITY = "v1.0.0"
# DuckDB gives every table at least one block: 64 KiB blocks instead of its 256 KiB keep a small capture's
# database small, and still let it bit-pack integers (which it does not in blocks of 32 KiB or less).
# DuckDB 1.0 reads only 256 KiB blocks; 1.1 and newer read any size.
BLOCK_SIZE = 65_536
# DuckDB's own default is 80% of the machine's memory; an ingest spills to disk beyond this instead
# (benchmarks/bench_ingest.py measures the peak memory it gives).
DEFAULT_MEMORY_LIMIT = "512MB"


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

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def default_loaders(nsys_executable: str | Path | None = None) -> list[Loader]:
    """The loaders `ingest` uses unless given others, narrowest kind first.

    A run directory holds Parquet files as a parquetdir export does, so its loader goes first.
    """
    return [RunDirLoader(), NsysLoader(nsys_executable)]


def ingest(
    sources: Sequence[str | Path],
    db: str | Path,
    *,
    loaders: Sequence[Loader] | None = None,
    options: IngestOptions = IngestOptions(),
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> IngestResult:
    """Load every source into a new DuckDB database at `db`, replacing any file there only on success."""
    started = clock()
    target = Path(db)
    paths = [Path(source) for source in sources]
    chosen = list(loaders) if loaders is not None else default_loaders()
    plan = [(path, _loader_for(path, chosen)) for path in paths]
    groups = _group(plan)
    for loader, claimed in groups:
        loader.check(claimed)
    _check_target(target, paths)
    progress = progress if progress is not None else Progress(enabled=False)
    building = target.with_name(f".{target.name}.{os.getpid()}.ingest")
    _remove_database(building)
    try:
        workdir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".work", dir=target.parent))
    except OSError as exc:
        raise UserError(f"{target}: cannot write in {target.parent} ({exc.strerror})")
    try:
        con = _connect(building, options)
        try:
            ctx = LoadContext(con, workdir, options.batch_rows, progress)
            con.begin()  # one transaction: the temporary file already makes the ingest all-or-nothing
            for path, loader in plan:
                loader.load(path, ctx)
            for loader, claimed in groups:
                loader.finish(claimed, ctx)
            con.commit()
            rows = ctx.rows_written
            notes = tuple(n for n in (_pairing_note(con),) if n)
        finally:
            con.close()
        os.replace(building, target)
        target.with_name(target.name + ".wal").unlink(missing_ok=True)  # a log of the database replaced
    except BaseException:
        _remove_database(building)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        progress.close()
    kinds = tuple(loader.kind for _, loader in plan)
    return IngestResult(target, tuple(paths), kinds, rows, clock() - started, notes)


def _pairing_note(con: duckdb.DuckDBPyConnection) -> str | None:
    """A run directory ingested beside a capture should be the run that capture recorded: a note when the
    two look like different runs (the comparison views would then compare unrelated requests).

    The capture's `step` ranges number the run log's iterations, and on a wall clock last as long as
    them (within NVTX overhead: 18 us median on the sample traces' 4-8 ms iterations); a capture may
    cover part of a run (a capture range), so fewer steps alone are no sign.
    """
    tables = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
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
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
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


def _check_target(target: Path, sources: list[Path]) -> None:
    if not sources:
        raise UserError("no sources to ingest")
    if why := no_folder_for(target):
        raise UserError(f"{target}: {why}")
    if target.is_dir():
        raise UserError(f"{target}: is a folder, not a database file")
    if any(target.resolve() == source.resolve() for source in sources):
        raise UserError(f"{target}: the database would overwrite one of the sources")
    for source in sources:  # a file inside a source folder, e.g. a run's events.parquet, is a source too
        if source.is_dir() and source.resolve() in target.resolve().parents and not _is_database(target):
            raise UserError(f"{target}: the database would overwrite a file of the source {source}")


def _is_database(path: Path) -> bool:
    """Whether `path` is absent or a DuckDB file (which `--db` may replace): its header says DUCK at byte 8."""
    if not path.exists():
        return True
    with path.open("rb") as f:
        return f.read(12)[8:] == b"DUCK"


def _connect(path: Path, options: IngestOptions) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | int] = {"storage_compatibility_version": STORAGE_COMPATIBILITY,
                                    "default_block_size": str(BLOCK_SIZE)}
    config["memory_limit"] = options.memory_limit or DEFAULT_MEMORY_LIMIT
    if options.threads:
        config["threads"] = options.threads
    try:
        return duckdb.connect(str(path), config=config)
    except (duckdb.InvalidInputException, duckdb.ParserException) as exc:  # e.g. a memory limit it cannot parse
        settings = ", ".join(f"{key}={value}" for key, value in config.items())
        raise UserError(f"DuckDB refused the settings {settings} ({first_line(exc)})")


def _remove_database(path: Path) -> None:
    for leftover in (path, path.with_name(path.name + ".wal")):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(path.with_name(path.name + ".tmp"), ignore_errors=True)
