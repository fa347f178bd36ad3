"""The per-kind loader interface, and the context through which loaders write into the database."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import duckdb

from itertrace.errors import UserError
from itertrace.interrupts import deferred
from itertrace.ingest.arrow_io import first_line
from itertrace.ingest.progress import Progress

if TYPE_CHECKING:
    from itertrace.ingest.arrow_io import TableStream


class Loader(Protocol):
    """One kind of source (an nsys export, an engine run directory, ...) and how it enters the database.

    `ingest` offers each source to the loaders in order and the first whose `claims` answers True takes
    it, so a loader for a narrower kind goes before a broader one. Before anything is written, `check`
    sees every source the loader took and raises `UserError` for any it cannot load; then `load` runs
    once per source, in the order given, and `finish` once after all sources of every kind are in.
    A loader that takes only folders may say so with a class attribute `folders_only = True`; the
    message about an unrecognised file then names it last.
    """

    kind: str  # short name, e.g. "nsys"
    accepts: str  # what it takes, in words, for the message about an unrecognised source

    def claims(self, path: Path) -> bool: ...

    def check(self, paths: list[Path]) -> None: ...

    def load(self, path: Path, ctx: LoadContext) -> None: ...

    def finish(self, paths: list[Path], ctx: LoadContext) -> None: ...


@dataclass(frozen=True)
class EventCount:
    """Events of one category (a trace's `cat`) and what became of them: the table or use they went to, or,
    for events skipped, why."""

    category: str
    events: int
    kept_in: str | None  # None: skipped
    skipped_why: str | None = None

    @property
    def text(self) -> str:
        return f"{self.category} {self.events:,} ({self.kept_in or self.skipped_why})"


def events_line(counts: list[EventCount] | tuple[EventCount, ...]) -> str:
    """One line on what was kept and what skipped, by category, most events first: the ingest's closing line."""
    def order(c: EventCount) -> tuple:
        return -c.events, c.category.lower(), c.kept_in or c.skipped_why or ""

    kept = sorted((c for c in counts if c.kept_in), key=order)
    skipped = sorted((c for c in counts if not c.kept_in), key=order)
    total, held = sum(c.events for c in counts), sum(c.events for c in kept)
    line = f"kept {held:,} of {total:,} trace events: " + (", ".join(c.text for c in kept) or "none")
    return line + "; skipped " + (f"{total - held:,}: " + ", ".join(c.text for c in skipped) if skipped else "none")


@dataclass
class LoadContext:
    """The open database and ingest settings, shared by every loader of one ingest call."""

    con: duckdb.DuckDBPyConnection
    workdir: Path  # scratch space beside the database, removed when the ingest ends
    batch_rows: int
    progress: Progress
    rows_written: int = 0
    notes: list[str] = field(default_factory=list)  # what a loader left out and why, for the closing summary
    event_counts: list[EventCount] = field(default_factory=list)  # trace events by category, where a loader counts them
    _readers: int = field(default=0, repr=False)

    def write_table(self, schema: str, table: TableStream, name: str | None = None) -> None:
        """Create `schema.name` (default: the table's own name) from the table's batches, streaming."""
        import pyarrow as pa  # here, not above: a Kineto ingest never imports it

        from itertrace.ingest.convert import uniform_batch, uniform_schema

        arrow_schema = uniform_schema(table.schema)
        failures: list[BaseException] = []

        def batches():
            try:
                for batch in table.read(self.batch_rows):
                    yield uniform_batch(batch, arrow_schema)
                    self.progress.advance(batch.num_rows, table.name)
            except Exception as exc:  # surfaces inside DuckDB's scan; remembered to name the file
                failures.append(exc)
                raise

        self._readers += 1
        view = f"_ingest_stream_{self._readers}"
        self.con.register(view, pa.RecordBatchReader.from_batches(arrow_schema, batches()))
        try:
            with deferred():  # the generator runs inside DuckDB's scan: a signal must not raise in it
                self.con.execute(f"CREATE TABLE {quote(schema)}.{quote(name or table.name)} AS SELECT * FROM {view}")
        except duckdb.Error as exc:
            self._unregister(view)
            if failures:
                raise UserError(f"{table.file}: cannot read table {table.name} ({first_line(failures[0])})") from exc
            raise
        self.con.unregister(view)
        self.rows_written += table.num_rows

    def _unregister(self, view: str) -> None:
        try:
            self.con.unregister(view)
        except duckdb.TransactionException:  # the failed statement aborted the transaction; the view goes with it
            pass


def quote(identifier: str) -> str:
    """`identifier` as a quoted SQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'
