"""itertrace.queries: SQL modules (`*.sql`) over an ingested database, and the code that installs and runs them."""
from __future__ import annotations

import importlib

# Where each public name lives; loaded on first use, so that importing a submodule (the `itertrace`
# command imports itertrace.queries.cli to list its subcommands) does not import DuckDB and pyarrow.
_HOMES = {"QueryDB": "api", "connect": "api", "install": "api", "set_params": "api", "queries": "catalog"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = ["QueryDB", "connect", "install", "queries", "set_params"]
