"""itertrace.ingest: Nsight Systems reports and exports, and the engine's run directories, into DuckDB, SQLite-free.

`ingest(sources, db)` loads each source through the first loader that claims it (see `Loader`) into a
database built aside and renamed into place. nsys's tables keep their names in the schema `nsys`;
documented tables (`normalized_tables()`) are built in the main schema. `itertrace.ingest.nsys` runs
the nsys command line (capture, export, versions).
"""
from itertrace.ingest.api import IngestOptions, IngestResult, default_loaders, ingest
from itertrace.ingest.loader import LoadContext, Loader
from itertrace.ingest.normalize import normalized_tables
from itertrace.ingest.nsys_loader import RAW_SCHEMA, NsysLoader, SourceKind
from itertrace.ingest.progress import Progress
from itertrace.ingest.rundir_loader import RunDirLoader

__all__ = [
    "RAW_SCHEMA",
    "IngestOptions",
    "IngestResult",
    "LoadContext",
    "Loader",
    "NsysLoader",
    "Progress",
    "RunDirLoader",
    "SourceKind",
    "default_loaders",
    "ingest",
    "normalized_tables",
]
