"""Every real export in ../shared/nsys_samples ingests and agrees with counts computed straight from its files."""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from itertrace.ingest import ingest, normalized_tables
from itertrace.ingest.normalize import stored_tables

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "nsys_samples"
EXPORTS = sorted(SAMPLES.glob("arrow_2022.4/*.arrow")) + sorted(SAMPLES.glob("*_pqtdir"))
RANGE_TYPES = {59, 60, 70, 71}
PID_MASK = ~0xFFFFFF

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(not EXPORTS, reason=f"real nsys exports not found at {SAMPLES}"),
]


def read_tables(export: Path) -> dict[str, list[dict]]:
    """Every table of an export as plain Python rows, read with pyarrow alone."""
    if export.is_dir():
        return {file.stem: pq.read_table(file).to_pylist() for file in export.glob("*.parquet")}
    tables = {}
    with pa.OSFile(str(export)) as source:
        size = export.stat().st_size
        while source.tell() < size:
            reader = ipc.open_stream(source)
            tables[reader.schema.metadata[b"table_name"].decode()] = reader.read_all().to_pylist()
    return tables


@pytest.fixture(scope="module", params=EXPORTS, ids=lambda p: p.name)
def sample(request, tmp_path_factory):
    """(raw tables read independently, connection to the ingested database) for one export."""
    export = request.param
    db = tmp_path_factory.mktemp("db") / "trace.duckdb"
    ingest([export], db)
    con = duckdb.connect(str(db), read_only=True)
    yield read_tables(export), con
    con.close()


def count(con, sql: str) -> int:
    return con.execute(sql).fetchone()[0]


def test_raw_tables_keep_every_row(sample):
    raw, con = sample
    stored = {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables "
                                              "WHERE table_schema = 'nsys' AND table_name NOT LIKE '\\_%' ESCAPE '\\'").fetchall()}
    assert stored == set(raw)  # tables and views (nsys_store); the hidden tables behind them start with _
    for name, rows in raw.items():
        assert count(con, f'SELECT count(*) FROM nsys."{name}"') == len(rows), name


def test_counts_match_the_export(sample):
    raw, con = sample
    nvtx = raw.get("NVTX_EVENTS", [])
    assert count(con, "SELECT count(*) FROM nvtx_ranges") == sum(e["eventType"] in RANGE_TYPES for e in nvtx)
    assert count(con, "SELECT count(*) FROM nvtx_marks") == sum(e["eventType"] == 34 for e in nvtx)
    for kind, table in (("kernel", "KERNEL"), ("memcpy", "MEMCPY"), ("memset", "MEMSET")):
        expected = len(raw.get(f"CUPTI_ACTIVITY_KIND_{table}", []))
        assert count(con, f"SELECT count(*) FROM gpu_ops WHERE kind = '{kind}'") == expected, kind
    runtime = raw.get("CUPTI_ACTIVITY_KIND_RUNTIME", [])
    assert count(con, "SELECT count(*) FROM cuda_api") == sum(r["eventClass"] != 67 for r in runtime)
    threads = {row["globalTid"] for table in ("ThreadNames", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME")
               for row in raw.get(table, []) if row["globalTid"] is not None}
    assert count(con, "SELECT count(*) FROM threads") == len(threads)


def test_names_resolve(sample):
    raw, con = sample
    strings = {row["id"]: _text(row["value"]) for row in raw["StringIds"]}
    kernels = raw.get("CUPTI_ACTIVITY_KIND_KERNEL", [])
    expected = Counter(strings[k["demangledName"]] for k in kernels)
    assert Counter(dict(con.execute("SELECT name, count(*) FROM gpu_ops WHERE kind = 'kernel' GROUP BY name").fetchall())) == expected
    ranges = [e for e in raw.get("NVTX_EVENTS", []) if e["eventType"] in RANGE_TYPES]
    expected_text = Counter(_text(e["text"]) if e["text"] is not None else strings.get(e["textId"]) for e in ranges)
    assert Counter(dict(con.execute("SELECT text, count(*) FROM nvtx_ranges GROUP BY text").fetchall())) == expected_text
    assert count(con, "SELECT count(*) FROM cuda_api WHERE name IS NULL") == 0


def test_gpu_projection_matches_plain_python(sample):
    raw, con = sample
    expected = plain_projection(raw)
    got = Counter(con.execute("""
        SELECT r.global_tid, r.start_ns, coalesce(r.end_ns, (SELECT max(greatest(start, coalesce("end", start)))
                                                              FROM nsys.NVTX_EVENTS)),
               p.gpu_start_ns, p.gpu_end_ns, p.gpu_op_count, p.launch_count
        FROM nvtx_gpu_projection p JOIN nvtx_ranges r USING (range_id)""").fetchall()) if expected else Counter()
    assert got == expected
    if "NVTX_EVENTS" in raw and "CUPTI_ACTIVITY_KIND_RUNTIME" in raw:
        # A few ranges spelled out, so that a failure shows a readable example.
        for row in sorted(expected)[:3]:
            assert got[row] == expected[row]


def test_push_pop_nesting_matches_a_stack(sample):
    raw, con = sample
    expected = plain_nesting(raw.get("NVTX_EVENTS", []))
    got = Counter(con.execute("""
        SELECT r.global_tid, r.start_ns, r.end_ns, r.depth, p.start_ns, p.end_ns
        FROM nvtx_ranges r LEFT JOIN nvtx_ranges p ON p.range_id = r.parent_range_id
        WHERE r.range_kind = 'push_pop'""").fetchall())
    assert got == expected


def test_capture_meta_and_comments(sample):
    raw, con = sample
    meta = {_text(r["name"]): _text(r["value"]) for r in raw.get("META_DATA_EXPORT", raw.get("EXPORT_META_DATA", []))}
    version, schema = con.execute("SELECT nsys_version, export_schema_version FROM capture_meta").fetchone()
    assert (version, schema) == (meta["EXPORT_PRODUCT_VERSION"], meta["EXPORT_SCHEMA_VERSION"])
    missing = con.execute("""
        SELECT table_name || '.' || column_name FROM duckdb_columns()
        WHERE schema_name = 'main' AND NOT internal AND coalesce(comment, '') = ''""").fetchall()
    assert missing == []
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' UNION ALL "
                                        "SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal"
                                        ).fetchall()}
    # and the table the small ones are folded into (ingest/fold.py), where any are
    assert tables - {"_small_tables"} == set(normalized_tables()) | set(stored_tables())


def plain_projection(raw: dict[str, list[dict]]) -> Counter:
    """Nsight's NVTX GPU projection, computed row by row in Python."""
    nvtx = raw.get("NVTX_EVENTS", [])
    ops = defaultdict(list)
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        for op in raw.get(f"CUPTI_ACTIVITY_KIND_{table}", []):
            ops[(op["correlationId"], op["globalPid"])].append((op["start"], op["end"]))
    launches = defaultdict(list)  # thread -> [(api start, api end, first gpu start, last gpu end, ops)]
    for api in raw.get("CUPTI_ACTIVITY_KIND_RUNTIME", []):
        work = ops.get((api["correlationId"], api["globalTid"] & PID_MASK))
        if api["eventClass"] != 67 and work:
            launches[api["globalTid"]].append(
                (api["start"], api["end"], min(s for s, _ in work), max(e for _, e in work), len(work)))
    for calls in launches.values():
        calls.sort()
    trace_end = max((max(e["start"], e["end"] or e["start"]) for e in nvtx), default=0)
    out = Counter()
    for e in nvtx:
        if e["eventType"] not in RANGE_TYPES or e["endGlobalTid"] not in (None, e["globalTid"]):
            continue
        end = e["end"] if e["end"] is not None else trace_end
        calls = launches.get(e["globalTid"], [])
        first = bisect.bisect_left(calls, (e["start"],))
        inside = [c for c in calls[first:bisect.bisect_right(calls, (end, float("inf")))] if c[1] <= end]
        if inside:
            out[(e["globalTid"], e["start"], end, min(c[2] for c in inside), max(c[3] for c in inside),
                 sum(c[4] for c in inside), len(inside))] += 1
    return out


def plain_nesting(nvtx: list[dict]) -> Counter:
    """(thread, start, end, depth, parent start, parent end) of each push/pop range, by a per-thread stack."""
    trace_end = max((max(e["start"], e["end"] or e["start"]) for e in nvtx), default=0)
    by_thread = defaultdict(list)
    for row, e in enumerate(nvtx):
        if e["eventType"] in (59, 70):
            end = e["end"] if e["end"] is not None else trace_end
            by_thread[e["globalTid"]].append((e["start"], -max(end, e["start"]), row, e["end"]))
    out = Counter()
    for thread, ranges in by_thread.items():
        stack: list[tuple[int, int, int | None]] = []  # (start, effective end, recorded end)
        for start, neg_end, _, recorded in sorted(ranges):
            end = -neg_end
            while stack and (stack[-1][1] < start or (stack[-1][1] == start and stack[-1][1] > stack[-1][0])):
                stack.pop()
            parent = stack[-1] if stack and stack[-1][1] >= end else None
            out[(thread, start, recorded, len(stack), parent and parent[0], parent and parent[2])] += 1
            stack.append((start, end, recorded))
    return out


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
