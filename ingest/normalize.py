"""Build the normalized, documented tables (nvtx_ranges, gpu_ops, ...) from the raw nsys tables."""
from __future__ import annotations

import threading
from collections.abc import Callable
from importlib import resources

import duckdb

from itertrace.ingest.adapters import RAW_VIEWS, create_raw_views_over, schema_relations
from itertrace.ingest.background import WORK, SideJob
from itertrace.ingest.plans import prefer_sort_based_joins
from itertrace.ingest.progress import Progress
from itertrace.ingest.sqldoc import comment_statements, statements, table_docs
from itertrace.interrupts import deferred

# In dependency order: each file may read the tables of the files before it. nvtx_ranges waits for
# the ranges' nesting, made meanwhile on a second connection (`_build`): the files before it do not.
SQL_FILES = (
    "capture_meta.sql",
    "threads.sql",
    "processes.sql",
    "capture_spans.sql",
    "nvtx_names.sql",
    "nvtx_marks.sql",
    "cuda_api.sql",
    "gpu_ops.sql",
    "nvtx_ranges.sql",
    "nvtx_gpu_projection.sql",
)
NESTING = "_nvtx_range_nesting"  # made by ingest/nesting.py, read by nvtx_ranges.sql


# nesting.py and projection.py import pyarrow, which a Kineto ingest (reading this module's SQL) never does.
def create_range_nesting(con: duckdb.DuckDBPyConnection, table: str, cancel: threading.Event | None = None) -> None:
    """nesting.create_range_nesting, imported when first called."""
    from itertrace.ingest.nesting import create_range_nesting as create

    create(con, table, cancel)


def _walked_projection(con: duckdb.DuckDBPyConnection) -> None:
    from itertrace.ingest.projection import create_walked_projection

    create_walked_projection(con)


# Temp tables the SQL reads that Python makes, each just before the first statement that names it.
PYTHON_TABLES = {"_nvtx_projection_walked": _walked_projection}


def sql_text(name: str) -> str:
    """The text of one of this package's SQL files."""
    return resources.files("itertrace.ingest").joinpath("sql", name).read_text(encoding="utf-8")


def normalized_tables() -> list[str]:
    """Names of the normalized tables and views, in the order they are built (not the hidden tables, `_*`,
    that views such as nvtx_ranges read)."""
    return [doc.table for name in SQL_FILES for doc in table_docs(sql_text(name)) if not doc.table.startswith("_")]


def stored_tables() -> list[str]:
    """Names of the tables (not views) the normalized SQL creates, the hidden ones that views read included."""
    return [doc.table for name in SQL_FILES for doc in table_docs(sql_text(name)) if doc.kind == "TABLE"]


def build_normalized(
    con: duckdb.DuckDBPyConnection,
    raw_schema: str,
    source: str,
    source_kind: str,
    progress: Progress | None = None,
) -> None:
    """Create every normalized table in the main schema from the raw tables in `raw_schema` (committed:
    a second connection reads them too), with comments."""
    relations, columns = schema_relations(con, raw_schema)
    build_normalized_over(con, relations, columns, source, source_kind, progress)


def build_normalized_over(
    con: duckdb.DuckDBPyConnection,
    relations: dict[str, str],
    columns: dict[str, dict[str, str]],
    source: str,
    source_kind: str,
    progress: Progress | None = None,
    open_reader: Callable[[], duckdb.DuckDBPyConnection] | None = None,
) -> None:
    """Create every normalized table from raw tables given as relations (see `adapters.create_raw_views_over`).

    `open_reader` opens a second connection to the database on which `relations` read the same (it
    defaults to a cursor of `con`: enough where they name no Arrow tables registered on `con` alone)."""
    prefer_sort_based_joins(con)
    create_raw_views_over(con, relations, columns)

    def open_side() -> duckdb.DuckDBPyConnection:
        side = open_reader() if open_reader is not None else con.cursor()
        create_raw_views_over(side, relations, columns, _NVTX_VIEWS)
        return side

    _build(con, source, source_kind, progress, open_side)


_NVTX_VIEWS = tuple(view for view in RAW_VIEWS if view.view == "_raw_nvtx")  # what the nesting reads


def _build(con: duckdb.DuckDBPyConnection, source: str, source_kind: str, progress: Progress | None,
           open_side: Callable[[], duckdb.DuckDBPyConnection]) -> None:
    """Run every SQL file on `con`; the ranges' nesting meanwhile on `open_side()` (see `background`)."""
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_source AS SELECT ?::VARCHAR AS source, ?::VARCHAR AS source_kind",
                [source, source_kind])
    job = SideJob(con, open_side, lambda side, cancel: create_range_nesting(side, f"{WORK}.{NESTING}", cancel))

    def read_nesting(con: duckdb.DuckDBPyConnection) -> None:  # touches WORK only once the job is done
        job.wait()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {NESTING} AS SELECT * FROM {WORK}.{NESTING}")

    makers = {NESTING: read_nesting, **PYTHON_TABLES}
    try:
        job.start()
        made: set[str] = set()
        for name in SQL_FILES:
            text = sql_text(name)
            if progress is not None:
                progress.phase(f"building {', '.join(d.table for d in table_docs(text) if not d.table.startswith('_'))}")
            for statement in statements(text):
                _execute(con, statement, made, makers)
            for statement in comment_statements(text):
                con.execute(statement)
    finally:
        job.close()
    con.execute(f"DROP VIEW IF EXISTS {NESTING}")
    con.execute(f"DETACH {WORK}")


def _execute(con: duckdb.DuckDBPyConnection, statement: str, made: set[str],
             makers: dict[str, Callable[[duckdb.DuckDBPyConnection], None]]) -> None:
    """Run `statement`, after making the tables of `makers` it names that are not made yet (`made`)."""
    for name, make in makers.items():
        if name in statement and name not in made:
            make(con)
            made.add(name)
    with deferred():  # the statement may scan Arrow tables through pyarrow's Python: no signal raises in it
        con.execute(statement)
