"""The loader for Nsight Systems captures: a .nsys-rep, its Arrow export, or an arrowdir/parquetdir folder.

The export's tables are read where they lie (`scan`): the normalized tables are built from them in the
main schema, then nsys's own tables are written into the schema `nsys` (text decoded to VARCHAR,
integers widened to BIGINT, see `convert`), each value once (`nsys_store`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from itertrace.errors import UserError
from itertrace.ingest.arrow_io import arrow_export_tables, folder_tables, table_files
from itertrace.ingest.checks import check_raw_tables
from itertrace.ingest.loader import LoadContext
from itertrace.ingest.fold import fold_small_tables
from itertrace.ingest.normalize import build_normalized_over, stored_tables
from itertrace.ingest.nsys import check_report, export_arrow, find_nsys, report_version
from itertrace.ingest.nsys_store import SCHEMA as RAW_SCHEMA
from itertrace.ingest.nsys_store import store_raw_tables

# Tables by which a folder of TABLE.parquet / TABLE.arrow files is recognised as an nsys export.
_EXPORT_TABLES = frozenset({"StringIds", "ThreadNames", "PROCESSES", "NVTX_EVENTS", "META_DATA_EXPORT",
                            "EXPORT_META_DATA", "META_DATA_CAPTURE", "TARGET_INFO_SESSION_START_TIME"})
_EXPORT_PREFIXES = ("CUPTI_ACTIVITY_KIND_", "TARGET_INFO_", "ENUM_NSYS_")


class SourceKind(enum.Enum):
    """The forms in which an nsys capture can be ingested."""

    REPORT = "nsys-rep"
    ARROW = "arrow"
    ARROWDIR = "arrowdir"
    PARQUETDIR = "parquetdir"


@dataclass(frozen=True)
class NsysLoader:
    """Loads one nsys capture per database, from any of the forms in `SourceKind`."""

    nsys_executable: str | Path | None = None  # for .nsys-rep sources; default: nsys on PATH

    kind: ClassVar[str] = "nsys"
    accepts: ClassVar[str] = ("an Nsight Systems report (.nsys-rep), its Arrow export (.arrow), "
                              "or an arrowdir or parquetdir export folder")

    def claims(self, path: Path) -> bool:
        """True for the file types of nsys, and for folders holding nsys tables."""
        if path.is_dir():
            return any(_is_export_table(file.stem) for file in table_files(path))
        return path.suffix in (".nsys-rep", ".qdrep", ".arrow", ".sqlite", ".qdstrm")

    def check(self, paths: list[Path]) -> None:
        """Refuse what cannot load: SQLite exports, raw streams, newer reports, more than one capture."""
        kinds = [source_kind(path) for path in paths]
        if len(paths) > 1:
            raise UserError(f"{paths[1]}: a database holds one nsys capture and {paths[0]} is already one; "
                            "ingest each capture into its own database")
        for path, kind in zip(paths, kinds):
            if kind is SourceKind.REPORT:
                report_version(path)  # a file that is no report says so before nsys is looked for
                check_report(path, find_nsys(self.nsys_executable))

    def load(self, path: Path, ctx: LoadContext) -> None:
        """Build the normalized tables from the capture's tables, then write those into the `nsys` schema."""
        from itertrace.ingest.scan import open_sources  # imports pyarrow: not for Kineto traces

        kind = source_kind(path)
        export = None
        if kind is SourceKind.REPORT:
            ctx.progress.phase(f"exporting {path.name} to Arrow")
            export = export_arrow(path, ctx.workdir / f"{path.stem}.arrow", find_nsys(self.nsys_executable))
            tables = arrow_export_tables(export)
        elif kind is SourceKind.ARROW:
            tables = arrow_export_tables(path)
        else:
            tables = folder_tables(path)
        if not tables:
            raise UserError(f"{path}: the export holds no tables")
        ctx.progress.expect(sum(table.num_rows for table in tables))
        sources = open_sources(ctx.con, tables)
        try:
            check_raw_tables(ctx.con, sources.relations, path)
            columns = {name: {c.name.lower(): c.name for c in found} for name, found in sources.columns.items()}
            build_normalized_over(ctx.con, sources.relations, columns, str(path.resolve()), kind.value, ctx.progress,
                                  sources.reader)
            store_raw_tables(ctx, sources, tables, drop_volatile=export is not None)
            fold_small_tables(ctx.con, stored_tables())
        finally:
            sources.close()
        if export is not None:
            export.unlink()

    def finish(self, paths: list[Path], ctx: LoadContext) -> None:
        """Nothing to build across sources: a database holds one capture, built whole by `load`."""


def source_kind(path: Path) -> SourceKind:
    """Which form of nsys capture `path` is; UserError for nsys files that cannot be ingested."""
    if path.is_dir():
        suffixes = {file.suffix for file in table_files(path)}
        return SourceKind.PARQUETDIR if suffixes == {".parquet"} else SourceKind.ARROWDIR
    if path.suffix in (".nsys-rep", ".qdrep"):
        return SourceKind.REPORT
    if path.suffix == ".arrow":
        return SourceKind.ARROW
    if path.suffix == ".sqlite":
        stem = path.with_suffix("")
        raise UserError(
            f"{path}: SQLite exports are not read; export the report to Arrow instead: "
            f"`nsys export --type arrow -o {stem}.arrow {stem}.nsys-rep`, then ingest {stem}.arrow "
            f"(or ingest {stem}.nsys-rep directly)")
    if path.suffix == ".qdstrm":
        raise UserError(
            f"{path}: a raw capture stream, not a report; make the report with `QdstrmImporter -i {path}` "
            "(found in Nsight Systems' host-linux-x64 folder), then ingest the .nsys-rep it writes")
    raise UserError(f"{path}: not an nsys capture")


def _is_export_table(name: str) -> bool:
    return name in _EXPORT_TABLES or name.startswith(_EXPORT_PREFIXES)
