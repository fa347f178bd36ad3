"""What a PyTorch profiler trace must hold to be ingested, checked on its top-level keys and staged events.

Refused, with one line naming the file: a baseTimeNanoseconds that is not a Unix time in ns that fits
the range of stored times, and times (ts, ts + dur, after the files' clocks are aligned) past that range:
±2^62 ns, within which any two times differ by a 64-bit integer (`checks.TIME_LIMIT_NS`).

Left out, with a note per file counting them by category: events of the kinds the tables read (complete
events of the CPU and GPU categories, instants on a thread) that have no ts (or, complete events, no
dur), a negative dur, or a pid or tid that is not an integer (a number with a fraction, a string
of other than digits, true, one past 64 bits). Kineto's own events on no thread (the global instants
and the Spans track, whose pid is text) are not read and not counted.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

from itertrace.errors import UserError
from itertrace.ingest.checks import TIME_LIMIT_NS, TIME_RANGE

BASE_TIME = "baseTimeNanoseconds"
# The reasons the stage writes into _kineto_events.left_out, and how a note says each.
_WHY = {"time": "without ts or dur", "negative": "with a negative dur", "id": "whose pid or tid is not an integer"}


def check_base_time(path: Path, meta: dict[str, Any]) -> None:
    """UserError when the file's baseTimeNanoseconds, if it has one, is no Unix time in ns that is stored."""
    base = meta.get(BASE_TIME)
    if base is None:
        return
    if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base < TIME_LIMIT_NS:
        raise UserError(f"{path}: {BASE_TIME} {json.dumps(base)} is not a Unix time in ns that itertrace stores "
                        "(an integer from 0 to 2^62 - 1)")


def check_time_range(con: duckdb.DuckDBPyConnection, shifts: dict[int, int], paths: list[Path]) -> None:
    """UserError when a file's times, moved by its shift (what aligns its clock with the others'), leave the range."""
    for source_no, low, high in con.execute(
            "SELECT source_no, min(ts_ns), max(ts_ns::HUGEINT + greatest(coalesce(dur_ns, 0), 0)) "
            "FROM _kineto_events GROUP BY source_no ORDER BY source_no").fetchall():
        shift = shifts.get(source_no, 0)
        for value in (low, high):
            if value is not None and not -TIME_LIMIT_NS < value + shift < TIME_LIMIT_NS:
                counted = " once counted from the earliest file's base time" if shift else ""
                raise UserError(f"{paths[source_no - 1]}: times reach {value + shift} ns{counted}, past {TIME_RANGE}")


def leave_out(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> list[str]:
    """Delete the staged events the stage marked (`left_out`); a note per file and reason counting them."""
    found = con.execute("""
        SELECT source_no, CASE WHEN left_out IN ('time', 'negative') THEN left_out ELSE 'id' END,
               CASE WHEN ph IN ('i', 'I') THEN 'instant' ELSE coalesce(cat, ph) END, count(*), min(rowid),
               arg_min(left_out, rowid)
        FROM _kineto_events WHERE left_out IS NOT NULL GROUP BY ALL""").fetchall()
    # the events' categories and why they were left out, for the closing line's counts (kineto.sql)
    con.execute("CREATE OR REPLACE TEMP TABLE _kineto_left_out (category VARCHAR, skipped_why VARCHAR, events BIGINT)")
    if not found:
        return []
    con.execute("INSERT INTO _kineto_left_out SELECT coalesce(cat, ph), CASE WHEN left_out = 'time' THEN ? "
                "WHEN left_out = 'negative' THEN ? ELSE ? END, count(*) FROM _kineto_events "
                "WHERE left_out IS NOT NULL GROUP BY ALL",
                [f"events {_WHY['time']}", f"events {_WHY['negative']}", f"events {_WHY['id']}"])
    con.execute("DELETE FROM _kineto_events WHERE left_out IS NOT NULL")
    groups: dict[tuple[int, str], list[tuple[str, int, int, str]]] = {}
    for source_no, why, label, n, first_row, first in found:
        groups.setdefault((source_no, why), []).append((label, n, first_row, first))
    notes = []
    for (source_no, why), labels in sorted(groups.items(), key=lambda g: (g[0][0], list(_WHY).index(g[0][1]))):
        total = sum(n for _, n, _, _ in labels)
        parts = ", ".join(f"{n:,} {label}" for label, n, _, _ in sorted(labels, key=lambda x: (-x[1], x[0])))
        example = f"; the first: {min(labels, key=lambda x: x[2])[3]}" if why == "id" else ""
        notes.append(f"{paths[source_no - 1]}: {total:,} event{'s' if total != 1 else ''} {_WHY[why]} left out "
                     f"({parts}{example})")
    return notes
