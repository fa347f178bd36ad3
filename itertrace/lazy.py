"""Package exports imported on first use, so that `itertrace --help` and commands that draw or query
nothing do not pay for importing Altair, DuckDB or pyarrow."""
from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], object]:
    """A module-level `__getattr__` for `package` that imports each name from its submodule `homes[name]`."""

    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
