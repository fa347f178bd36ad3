"""itertrace.queries: SQL modules (`*.sql`) over an ingested database, and the code that installs and runs them."""
from __future__ import annotations

from itertrace.lazy import lazy_exports

# Where each public name lives: imported on first use (itertrace.lazy).
_HOMES = {"QueryDB": "api", "connect": "api", "install": "library", "set_params": "api", "queries": "catalog"}

__getattr__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
