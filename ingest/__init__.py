"""itertrace.ingest: Nsight Systems reports and exports, and the engine's run directories, into DuckDB, SQLite-free.

`ingest(sources, db)` loads each source through the first loader that claims it (see `Loader`) into a
database built aside and renamed into place. nsys's tables keep their names in the schema `nsys`;
documented tables (`normalized_tables()`) are built in the main schema. `itertrace.ingest.nsys` runs
the nsys command line (capture, export, versions).
"""
from __future__ import annotations

import importlib

# Where each public name lives; loaded on first use, so that importing a submodule (the `itertrace`
# command imports itertrace.ingest.cli to list its subcommands) does not import DuckDB and pyarrow.
_HOMES = {
    "IngestOptions": "api", "IngestResult": "api", "default_loaders": "api", "ingest": "api",
    "LoadContext": "loader", "Loader": "loader",
    "normalized_tables": "normalize",
    "RAW_SCHEMA": "nsys_loader", "NsysLoader": "nsys_loader", "SourceKind": "nsys_loader",
    "Progress": "progress",
    "RunDirLoader": "rundir_loader",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


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
