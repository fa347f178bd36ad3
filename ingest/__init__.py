"""itertrace.ingest: Nsight Systems reports and exports, and the engine's run directories, into DuckDB, SQLite-free.

`ingest(sources, db)` loads each source through the first loader that claims it (see `Loader`) into a
database built aside and renamed into place. nsys's tables keep their names in the schema `nsys`;
documented tables (`normalized_tables()`) are built in the main schema. `itertrace.ingest.nsys` runs
the nsys command line (capture, export, versions).
"""
from __future__ import annotations

from itertrace.lazy import lazy_exports

# Where each public name lives: imported on first use (itertrace.lazy).
_HOMES = {
    "IngestOptions": "api", "IngestResult": "api", "default_loaders": "api", "ingest": "api",
    "KinetoLoader": "kineto",
    "LoadContext": "loader", "Loader": "loader",
    "normalized_tables": "normalize",
    "RAW_SCHEMA": "nsys_loader", "NsysLoader": "nsys_loader", "SourceKind": "nsys_loader",
    "Progress": "progress",
    "RunDirLoader": "rundir_loader",
}

__getattr__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
