"""Every PyTorch profiler trace in ../shared/kineto_samples ingests and agrees with counts computed here from its JSON."""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from itertrace.ingest import ingest

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "kineto_samples"
TRACES = sorted(SAMPLES.glob("*.json.gz"))
API = {"cuda_runtime", "runtime", "cuda_driver", "driver"}
GPU = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset"}

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(not TRACES, reason=f"Kineto sample traces not found at {SAMPLES}"),
]


def read_events(trace: Path) -> tuple[dict, list[dict]]:
    """(top-level keys, events) of a trace, read with the json module, every number exact (Decimal)."""
    document = json.loads(gzip.decompress(trace.read_bytes()), parse_float=Decimal)
    return {k: v for k, v in document.items() if k != "traceEvents"}, document["traceEvents"]


def ns(us) -> int:
    """Microseconds, as the trace writes them, in integer nanoseconds."""
    return int(Decimal(us) * 1000)


def cat(event: dict) -> str:
    return str(event.get("cat", "")).lower()


def complete(events: list[dict], cats) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and cat(e) in cats]


def correlation(event: dict) -> int | None:
    args = event.get("args", {})
    return args.get("correlation", args.get("correlation id"))


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def sample(request, tmp_path_factory):
    """(top-level keys, events read here, connection to the database ingested from the same file)."""
    db = tmp_path_factory.mktemp("kineto") / "trace.duckdb"
    ingest([request.param], db)
    con = duckdb.connect(str(db), read_only=True)
    yield (*read_events(request.param), con)
    con.close()


def rows(con, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def test_counts_match_the_json(sample):
    meta, events, con = sample
    gpu = complete(events, GPU)
    by_kind = defaultdict(int)
    for e in gpu:
        by_kind[GPU[cat(e)]] += 1
    assert dict(rows(con, "SELECT kind, count(*) FROM gpu_ops GROUP BY kind")) == dict(by_kind)
    assert rows(con, "SELECT count(*) FROM cuda_api") == [(len(complete(events, API)),)]
    assert rows(con, "SELECT count(*) FROM nvtx_ranges") == [(len(complete(events, {"user_annotation", "python_function"})),)]
    assert rows(con, "SELECT count(*) FROM kineto_cpu_ops") == [(len(complete(events, {"cpu_op"})),)]
    assert rows(con, "SELECT count(*) FROM kineto_gpu_annotations") == [(len(complete(events, {"gpu_user_annotation"})),)]
    assert rows(con, "SELECT events FROM kineto_sources") == [(sum(1 for e in events if "ph" in e),)]


def test_correlations_matched(sample):
    _, events, con = sample
    launched = {correlation(e) for e in complete(events, API)} - {None}
    matched = sum(1 for e in complete(events, GPU) if correlation(e) in launched)
    assert rows(con, """SELECT count(*) FROM gpu_ops AS g JOIN cuda_api AS a
                        ON a.correlation_id = g.correlation_id AND a.global_pid = g.global_pid""") == [(matched,)]


def test_gpu_times_to_the_nanosecond(sample):
    _, events, con = sample
    expected = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in complete(events, GPU))
    assert rows(con, "SELECT start_ns, end_ns, name FROM gpu_ops ORDER BY ALL") == expected


def test_threads_and_rank(sample):
    meta, events, con = sample
    gpu_pids = {e["pid"] for e in complete(events, {*GPU, "gpu_user_annotation", "cuda_sync"})}
    cpu = {(e["pid"], e["tid"]) for e in events if e.get("ph") in ("X", "i", "I")
           and isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int) and e["pid"] not in gpu_pids}
    assert set(rows(con, "SELECT pid, tid FROM threads")) == cpu
    assert rows(con, "SELECT count(DISTINCT global_tid) FROM threads") == [(len(cpu),)]
    rank = meta.get("distributedInfo", {}).get("rank")
    assert rows(con, "SELECT rank, source_no FROM kineto_sources") == [(rank, 1)]
    devices = meta.get("deviceProperties") or []
    assert rows(con, "SELECT count(*) FROM kineto_devices") == [(len(devices),)]


def reference_nesting(ranges: list[dict]) -> dict[tuple, tuple]:
    """(tid, start, end, name) -> (depth, parent's key or None): a stack per thread, as push/pop ranges nest."""
    out: dict[tuple, tuple] = {}
    by_thread = defaultdict(list)
    for r in ranges:
        by_thread[r["tid"]].append((ns(r["ts"]), ns(r["ts"]) + ns(r["dur"]), r["name"]))
    for tid, spans in by_thread.items():
        stack: list[tuple] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start and not (stack[-1][0] == stack[-1][1] == start):
                stack.pop()
            parent = stack[-1] if stack and stack[-1][1] >= end else None
            out[(tid, start, end, name)] = (len(stack), None if parent is None else (tid, *parent))
            stack.append((start, end, name))
    return out


def test_nesting_per_thread(sample):
    _, events, con = sample
    got = rows(con, """SELECT r.tid, r.start_ns, r.end_ns, r.text, r.depth, p.tid, p.start_ns, p.end_ns, p.text
                       FROM nvtx_ranges AS r LEFT JOIN nvtx_ranges AS p ON p.range_id = r.parent_range_id""")
    assert {row[:4]: (row[4], None if row[5] is None else row[5:]) for row in got} == \
        reference_nesting(complete(events, {"user_annotation"}))


def test_projection_of_ranges_onto_the_gpu(sample):
    """Each range's GPU work: ops launched by runtime calls inside the range on its thread, in plain Python."""
    _, events, con = sample
    ops = defaultdict(list)
    for e in complete(events, GPU):
        ops[correlation(e)].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    calls = defaultdict(list)
    for e in complete(events, API):
        if correlation(e) in ops:
            calls[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), correlation(e)))
    expected = {}
    for r in complete(events, {"user_annotation"}):
        lo, hi = ns(r["ts"]), ns(r["ts"]) + ns(r["dur"])
        inside = [c for c in calls[(r["pid"], r["tid"])] if lo <= c[0] and c[1] <= hi]
        spans = [span for c in inside for span in ops[c[2]]]
        if spans:
            key = (r["tid"], lo, hi, r["name"])
            expected[key] = (min(s[0] for s in spans), max(s[1] for s in spans), len(spans), len(inside))
    got = rows(con, """SELECT r.tid, r.start_ns, r.end_ns, r.text, g.gpu_start_ns, g.gpu_end_ns, g.gpu_op_count,
                              g.launch_count
                       FROM nvtx_gpu_projection AS g JOIN nvtx_ranges AS r USING (range_id)""")
    assert {row[:4]: row[4:] for row in got} == expected


def test_several_ranks_in_one_database(tmp_path):
    first, second = SAMPLES / "cpu_only_rank34.json.gz", SAMPLES / "tiny_inference_rank1.json.gz"
    db = tmp_path / "ranks.duckdb"
    ingest([first, second], db)
    con = duckdb.connect(str(db), read_only=True)
    assert rows(con, "SELECT source_no, rank, world_size FROM kineto_sources ORDER BY 1") == [(1, 34, 300), (2, 1, None)]
    # each file's threads carry its number in the top bits; counts add up file by file
    per_file = rows(con, "SELECT global_tid >> 48, count(*) FROM threads GROUP BY 1 ORDER BY 1")
    for source_no, trace in enumerate((first, second), start=1):
        _, events = read_events(trace)
        gpu_pids = {e["pid"] for e in complete(events, GPU)}
        cpu = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "X" and isinstance(e.get("pid"), int)
               and isinstance(e.get("tid"), int) and e["pid"] not in gpu_pids}
        assert (source_no, len(cpu)) in per_file
    assert rows(con, "SELECT count(*) FROM capture_meta") == [(2,)]


def test_correlation_from_flow_events_where_args_have_none(tmp_path):
    """An older trace links calls to GPU work only by flow events: the same pairs as by args.correlation."""
    for name in ("alexnet_sync.json.gz", "tiny_inference_rank1.json.gz"):
        document = json.loads(gzip.decompress((SAMPLES / name).read_bytes()))  # whole-microsecond times: ints
        meta, events = {k: v for k, v in document.items() if k != "traceEvents"}, document["traceEvents"]
        stripped = [{**e, "args": {k: v for k, v in e["args"].items() if k != "correlation"}}
                    if cat(e) in API or cat(e) in GPU else e for e in events]
        trace = tmp_path / name.replace(".gz", "")
        trace.write_text(json.dumps({**meta, "traceEvents": stripped}))
        pairs = {}
        for label, source in (("args", SAMPLES / name), ("flows", trace)):
            db = tmp_path / f"{label}-{name}.duckdb"
            ingest([source], db)
            with duckdb.connect(str(db), read_only=True) as con:
                pairs[label] = rows(con, """SELECT a.start_ns, g.start_ns, g.name FROM gpu_ops AS g JOIN cuda_api AS a
                                            ON a.correlation_id = g.correlation_id ORDER BY ALL""")
        assert pairs["flows"] == pairs["args"] and len(pairs["args"]) > 0, name


# The range that is an iteration in each sample, for the generic mapping; None where a trace has no range
# that repeats (its report can only say so).
STEPS = {
    "alexnet_sync": r"^\[param\|pytorch\.model\.alex_net\|0\|0\|0\|(warmup|measure)\|forward\]$",
    "amd_mi250_rocm62": r"^ProfilerStep#\d+$",
    "cpu_only_rank34": r"^gloo:all_reduce$",
    "event_sync": r"^ProfilerStep#\d+$",
    "event_sync_multi_stream": None,
    "resnet_v100_ns_rank0": r"^## forward ##$",
    "sampled_rank0": r"^## encoder fp8 None ##$",
    "tiny_inference_rank1": None,
    "trace_diff_control": r"^nccl:all_to_all$",
}


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_report_on_each_sample(tmp_path, trace):
    from itertrace.dashboards.report import build_report

    db = tmp_path / "trace.duckdb"
    ingest([trace], db)
    with duckdb.connect(str(db), read_only=True) as con:
        gpu_ops = con.execute("SELECT count(*) FROM gpu_ops").fetchone()[0]
    report = build_report([db])  # no parameters: the mapping finds itself
    assert report.meta.column("capture").to_pylist()[0].startswith("kineto, ")
    names = [chart.name for chart in report.charts()]
    assert names, trace.name
    if gpu_ops:  # GPU work: its accounting is charted whatever the mapping found
        assert {"gpu-time", "gpu-idle-causes", "gpu-kernels"} <= set(names), names
    pattern = STEPS[trace.name.removesuffix(".json.gz")]
    if pattern is not None:  # told the iteration range, the report adds where the gaps between them went
        named = build_report([db], params={"preset": "generic", "step_pattern": pattern})
        if gpu_ops:
            assert "host-gaps" in [chart.name for chart in named.charts()], trace.name
        else:  # no device interval, so no gaps: a note says so instead of an empty chart
            gaps = next(s for s in named.sections if s.id == "host-gaps")
            assert [type(b).__name__ for b in gaps.blocks] == ["NoteBlock"], trace.name
