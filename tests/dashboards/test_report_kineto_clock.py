"""The report on PyTorch profiler traces whose times keep the profiler's clock: every time axis counts from the
capture's start, the steps are marked, the banner names the engine and its steps, kernels show short names.

The traces are written here: three vLLM steps 20 ms apart, each a `execute_context_0(0)_generation_8(8)`
annotation (2 ms) launching one kernel (from 3 ms to 8 ms into the step), on three clocks a Kineto trace
can carry: a clock since boot below baseTimeNanoseconds (as the vLLM trace in shared/serving_traces, whose
axes read in the billions of ms before), Unix time with no base, and times relative to the base. As the
profiler writes them, each holds its recording's Trace event (`PyTorch Profiler (0)`), from the first step's
start to the last kernel's end: the GPU's window.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from itertrace.dashboards.banner import mapping_line
from itertrace.dashboards.gpu_charts import gpu_time_chart
from itertrace.dashboards.html import table_html
from itertrace.dashboards.report import build_report
from itertrace.dashboards.time_axis import capture_start_ns
from itertrace.ingest import ingest
from itertrace.queries.api import QueryDB

STEP = "execute_context_0(0)_generation_8(8)"
FLASH = ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::half_t, "
         "Flash_kernel_traits<128, 64, 64, 4, cutlass::half_t> >, false, true, false, false, true, true, false, "
         "false>(Flash_fwd_params)")
BASE_NS = 1_767_189_312_000_000_000
CLOCKS = {  # name: (the first event's ts in µs, baseTimeNanoseconds)
    "boot clock below the base": (6_520_618_853_487.683, BASE_NS),
    "unix time without a base": (1_767_189_312_123_456.0, None),
    "relative to the base": (1_234.5, BASE_NS),
}
VLLM_SERVING = Path(__file__).parents[2] / ".." / "shared" / "serving_traces" / "vllm_decode_full_graph_step.json.gz"


def kineto_trace(path: Path, first_us: float, base_ns: int | None, steps: int = 3, step_name: str = STEP,
                 profiler_span: bool = True) -> Path:
    events = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
               "ts": first_us, "dur": (steps - 1) * 20_000 + 8_000}] if profiler_span else []
    for k in range(steps):
        t = first_us + k * 20_000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": step_name, "pid": 100, "tid": 100, "ts": t, "dur": 2_000},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": t + 500,
             "dur": 10, "args": {"correlation": 10 + k}},
            {"ph": "X", "cat": "kernel", "name": FLASH, "pid": 0, "tid": 7, "ts": t + 3_000, "dur": 5_000,
             "args": {"device": 0, "stream": 7, "correlation": 10 + k}},
        ]
    document = {"schemaVersion": 1, "traceEvents": events} | ({"baseTimeNanoseconds": base_ns} if base_ns else {})
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def units(spec: dict) -> list[dict]:
    if "mark" in spec:
        return [spec]
    found = [u for key in ("layer", "vconcat", "hconcat") for child in spec.get(key, []) for u in units(child)]
    return found + (units(spec["spec"]) if "spec" in spec else [])


def rows_of(spec: dict, field: str) -> list[dict]:
    """The rows of the spec's one dataset that has `field`."""
    (rows,) = [r for r in spec["datasets"].values() if r and field in r[0]]
    return rows


def chart(report, name: str) -> dict:
    return next(c.chart for c in report.charts() if c.name == name).to_dict()


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """{clock: (database, its report with no parameters)}."""
    made = {}
    for i, (clock, (first_us, base_ns)) in enumerate(CLOCKS.items()):
        folder = tmp_path_factory.mktemp(f"clock{i}")
        db = ingest([kineto_trace(folder / "trace.json.gz", first_us, base_ns)], folder / "t.duckdb").db
        made[clock] = (db, build_report([db]))
    return made


BOOT = "boot clock below the base"


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_every_time_axis_counts_from_the_capture_start_in_ms(reports, clock):
    report = reports[clock][1]
    gpu = chart(report, "gpu-time")
    strip, area = gpu["vconcat"]
    assert area["encoding"]["x"]["title"] == "time since the capture started (ms)"
    assert area["encoding"]["x"]["scale"]["domain"] == [0.0, 48.0]  # the first annotation to the last kernel's end
    starts = [r["start_ms"] for r in rows_of(gpu, "share")]
    assert min(starts) == 0.0 and max(starts) < 48.0
    (timeline,) = units(chart(report, "timeline"))
    assert timeline["encoding"]["x"]["title"] == "time since the capture started (ms)"
    bars = {(r["lane"], r["iteration"]): (r["start_ms"], r["end_ms"]) for r in rows_of(chart(report, "timeline"),
                                                                                       "lane")}
    assert bars[("host: step", 0)] == (0.0, 2.0) and bars[("host: step", 2)] == (40.0, 42.0)
    assert bars[("device", 1)] == (23.0, 28.0)
    lo, hi = timeline["encoding"]["x"]["scale"]["domain"]
    assert lo == 0.0 and 48.0 < hi < 49.0  # never before the capture's start


def test_the_gpu_time_chart_marks_each_step_with_its_number(reports):
    gpu = chart(reports[BOOT][1], "gpu-time")
    bands, numbers = units(gpu["vconcat"][0])
    rows = rows_of(gpu, "shade")
    host = sorted((r["start_ms"], r["end_ms"], r["step"]) for r in rows if r["lane"] == "host step")
    device = sorted((r["start_ms"], r["end_ms"], r["step"]) for r in rows if r["lane"] == "device interval")
    assert host == [(0.0, 2.0, "0"), (20.0, 22.0, "1"), (40.0, 42.0, "2")]
    assert device == [(3.0, 8.0, "0"), (23.0, 28.0, "1"), (43.0, 48.0, "2")]
    assert numbers["mark"]["type"] == "text" and {"step"} <= {t["field"] for t in numbers["encoding"]["tooltip"]}
    assert bands["encoding"]["x"]["scale"]["domain"] == gpu["vconcat"][1]["encoding"]["x"]["scale"]["domain"]


def test_the_banner_names_the_engine_its_steps_and_how_the_mapping_was_chosen(reports):
    db, report = reports[BOOT]
    (line,) = report.mappings
    assert line == ("vLLM (torch profiler annotations): 3 steps, numbered 0 to 2, each a range named "
                    "`execute_context_#(#)_generation_#(#)`; mapping chosen automatically; the same explicitly: "
                    "`--param preset=vllm`.")
    with QueryDB(db, {"preset": "generic", "step_pattern": "^execute_"}) as q:
        given = mapping_line(q, db, "kineto")
    assert given == ("Steps of the program's own range: 3 steps, numbered 0 to 2, each a range named "
                     "`execute_context_#(#)_generation_#(#)`; mapping given: `--param preset=generic` with "
                     "step_pattern `^execute_`.")


def test_the_top_operations_table_shows_the_short_name_and_the_full_one_on_hover(reports):
    block = next(t for t in reports[BOOT][1].tables() if t.title == "Top GPU operations")
    assert block.table.column("name").to_pylist() == ["flash_fwd_kernel"]
    page = table_html(block.table, block.hover)
    escaped = FLASH.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f'<td title="{escaped}">flash_fwd_kernel</td>' in page
    assert page.count("Flash_fwd_kernel_traits") == 1  # in the title only: no column of full names


def test_a_capture_without_steps_says_so_and_where_to_look(tmp_path):
    db = ingest([kineto_trace(tmp_path / "t.json.gz", 1_234.5, BASE_NS, step_name="warmup")], tmp_path / "t.duckdb").db
    with QueryDB(db) as q:
        line = mapping_line(q, db, "kineto")
        gpu = gpu_time_chart(q.query("gpu_time_idle"), q.query("gpu_time"), iterations=q.query("iterations"),
                             origin_ns=capture_start_ns(q)).to_dict()
    assert line.startswith("No steps: auto found no range that repeats like an iteration")
    assert f"`itertrace mapping suggest --db {db}`" in line
    assert "vconcat" not in gpu and gpu["encoding"]["x"]["scale"]["domain"] == [0.0, 48.0]
    assert "no steps to mark: no iteration range was found" in gpu["title"]["subtitle"]


def test_without_the_profilers_span_the_gpu_window_is_its_work(tmp_path):
    trace = kineto_trace(tmp_path / "t.json.gz", 6_520_618_853_487.683, BASE_NS, profiler_span=False)
    db = ingest([trace], tmp_path / "t.duckdb").db
    with QueryDB(db) as q:
        source = q.sql("SELECT window_source FROM gpu_time").column(0).to_pylist()
        gpu = gpu_time_chart(q.query("gpu_time_idle"), q.query("gpu_time"), iterations=q.query("iterations"),
                             origin_ns=capture_start_ns(q)).to_dict()
    assert source == ["GPU work"]
    assert gpu["vconcat"][1]["encoding"]["x"]["scale"]["domain"] == [3.0, 48.0]  # first kernel's start to last's end


def test_a_capture_of_a_minute_counts_in_seconds(tmp_path):
    trace = kineto_trace(tmp_path / "t.json.gz", 6_520_618_853_487.683, BASE_NS, steps=1)
    document = json.loads(gzip.decompress(trace.read_bytes()))
    _, _, launch, kernel = document["traceEvents"]
    late = dict(kernel, ts=kernel["ts"] + 60_000_000, args={"device": 0, "stream": 7, "correlation": 99})
    document["traceEvents"] += [late, dict(launch, ts=late["ts"] - 100, args={"correlation": 99})]
    trace.write_bytes(gzip.compress(json.dumps(document).encode()))
    db = ingest([trace], tmp_path / "t.duckdb").db
    with QueryDB(db) as q:
        gpu = gpu_time_chart(q.query("gpu_time_idle"), q.query("gpu_time"), iterations=q.query("iterations"),
                             origin_ns=capture_start_ns(q)).to_dict()
    area = gpu["vconcat"][1]
    assert area["encoding"]["x"]["title"] == "time since the capture started (s)"
    assert area["encoding"]["x"]["scale"]["domain"] == [0.0, 60.008]  # the profiler's span, widened to the GPU's work
    assert min(r["start_s"] for r in rows_of(gpu, "share")) == 0.0


@pytest.mark.shared
@pytest.mark.skipif(not VLLM_SERVING.is_file(), reason=f"vLLM serving trace not found at {VLLM_SERVING.resolve()}")
def test_the_vllm_serving_trace_counts_from_its_first_instant(tmp_path):
    db = ingest([VLLM_SERVING], tmp_path / "vllm.duckdb").db
    with QueryDB(db) as q:
        start = capture_start_ns(q)
        window = q.sql("SELECT window_start_ns, window_end_ns FROM gpu_time").to_pylist()[0]
        host = q.sql("SELECT host_start_ns FROM iterations").column(0).to_pylist()
        first_gpu = q.sql("SELECT min(start_ns) FROM gpu_ops").column(0)[0].as_py()
        gpu = gpu_time_chart(q.query("gpu_time_idle"), q.query("gpu_time"), iterations=q.query("iterations"),
                             origin_ns=start).to_dict()
        line = mapping_line(q, db, "kineto")
    assert start == host[0] == 6_520_618_853_487_683  # the step's annotation
    # The file holds no Trace event of the profiler's (one step cut from a longer recording): the GPU's
    # window is its work, from its first operation, 8.37 ms into the step.
    assert window["window_start_ns"] == first_gpu == 6_520_618_861_858_561
    area = gpu["vconcat"][1]
    assert area["encoding"]["x"]["scale"]["domain"] == [(first_gpu - start) / 1e6, (window["window_end_ns"] - start) / 1e6]
    assert line.startswith("vLLM (torch profiler annotations): 1 step, a range named "
                           "`execute_#_context_#(sq#sk#sqsq#sqsk#)_generation_#(sq#sk#sqsq#sqsk#)`")
