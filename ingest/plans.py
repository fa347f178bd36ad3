"""The join plans DuckDB takes for the ingest's and the queries' interval joins."""
from __future__ import annotations

import duckdb


def prefer_sort_based_joins(con: duckdb.DuckDBPyConnection) -> None:
    """Keep DuckDB on its sort-based ASOF and IEJoin plans even where it underestimates row counts.

    Notes
    -----
    Below `asof_loop_join_threshold` estimated rows DuckDB runs an ASOF join as a nested loop, and
    below `merge_join_threshold` it takes a piecewise merge join over an IEJoin; both compare every
    pair of rows on a thread. Its estimates after filters and window functions run far low (60 rows
    estimated for 19k ranges in a real export), so both thresholds go to 0 for the
    ingest connection and for every query connection: on a trace of tens of thousands of iterations the
    nested loop takes host_gaps_parts from under a second to minutes.
    """
    for setting in ("asof_loop_join_threshold", "merge_join_threshold"):
        try:
            con.execute(f"SET {setting} = 0")
        except duckdb.CatalogException:  # an older DuckDB without this setting also lacks the shortcut
            pass
