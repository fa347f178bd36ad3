"""itertrace.fleet: many captures (a trace per rank, a report per node, one set per night) as Dask tasks.

`ingest_fleet` makes each capture's database as `itertrace ingest` does, a task per capture; `summarize_fleet`
runs each capture's queries as a task and reduces their Arrow tables with DuckDB into Hive-partitioned
Parquet and views (fleet_ranks, fleet_skew, ...). Captures have separate clocks: ranks are compared on
iteration numbers, never on time. `fleet_client` gives the Dask client both run on: a LocalCluster, or an
existing scheduler. docs/fleet.md is the manual.
"""
from __future__ import annotations

from itertrace.lazy import lazy_exports

# Where each public name lives: imported on first use (itertrace.lazy).
_HOMES = {
    "Capture": "captures", "PathRules": "captures", "find_captures": "captures",
    "ClusterOptions": "cluster", "fleet_client": "cluster",
    "Fleet": "layout", "existing": "layout", "new_or_existing": "layout",
    "FleetIngest": "ingest_tasks", "IngestSettings": "ingest_tasks", "ingest_fleet": "ingest_tasks",
    "FleetSummary": "summary", "QuerySettings": "summary", "summarize_fleet": "summary",
}

__getattr__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
