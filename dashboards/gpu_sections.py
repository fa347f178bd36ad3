"""The report's GPU sections for captures with GPU work: GPU time, idle causes, kernels, repeating ranges."""
from __future__ import annotations

import pyarrow as pa

from itertrace.dashboards import gpu_charts
from itertrace.dashboards.blocks import ChartBlock, NoteBlock, RunData, Section, TableBlock
from itertrace.dashboards.chart_data import label_runs
from itertrace.dashboards.gpu_charts import distinct_labels
from itertrace.kernel_names import short_kernel_name

NO_GPU = "its capture holds no GPU work (no kernel, memcpy or memset)"
TOP_ROWS = 10

_CAUSES = f"""
SELECT device_id, global_pid, cause_kind, cause, idle_ns, idle_share, within_ns, between_ns, outside_ns, spans
FROM gpu_time_causes QUALIFY row_number() OVER (PARTITION BY device_id, global_pid ORDER BY idle_ns DESC) <= {TOP_ROWS}
ORDER BY device_id, global_pid, idle_ns DESC"""
_KERNELS = f"SELECT * FROM gpu_time_kernels LIMIT {TOP_ROWS}"
_SUMMARY = ("SELECT device_id, global_pid, window_ns, busy_share, idle_within_share, idle_between_share, "
            "idle_outside_share, top_causes FROM gpu_time_summary")
_REPEATING = ("SELECT rank, name, domain, ranges, threads, gpu_share, time_share, period_p50_ns, period_cv, score, "
              "params FROM mapping_suggest ORDER BY rank LIMIT 10")


def gpu_sections(runs: list[RunData]) -> list[Section]:
    """The GPU sections, in page order, for the runs whose capture holds GPU work; without any, the repeating
    NVTX ranges alone for captures where no iteration range was found (so that the page still says which
    ranges could be one)."""
    gpu = [r for r in runs if r.gpu_ops]
    if gpu:
        return [_gpu_time(runs, gpu), _idle_causes(runs, gpu), _kernels(runs, gpu), _repeating(runs, gpu)]
    unmapped = [r for r in runs if r.capture and "nvtx_ranges" not in r.db.missing and not r.has_trace]
    return [_repeating(runs, unmapped, "its trace has iteration ranges")] if unmapped else []


def _name(chart: str, runs: list[RunData], run: RunData) -> str:
    from itertrace.dashboards.sections import _slug
    return f"{chart}-{_slug(run.label)}" if len(runs) > 1 else chart


def _stacked(gpu: list[RunData], sql: str):
    table = label_runs([(r.label, r.db.sql(sql)) for r in gpu], "run")
    return table.drop_columns(["run"]) if len(gpu) == 1 else table


def _left_out(runs: list[RunData], shown: list[RunData], why: str = NO_GPU) -> list[NoteBlock]:
    others = [r.label for r in runs if r not in shown]
    return [NoteBlock(f"Not shown for {', '.join(others)}: {why}.")] if others else []


def _gpu_time(runs: list[RunData], gpu: list[RunData]) -> Section:
    section = Section("gpu-time", "GPU time: busy and idle",
                      "Per GPU (and process using it), the capture window is split exactly into busy (its kernels, "
                      "memcpys and memsets on all streams, overlapping work counted once) and idle, and the idle "
                      "into within an iteration (inside an iteration's device interval, between its GPU work), "
                      "between iterations, and outside iterations (before the first, after the last, or all of it "
                      "when no iteration mapping was found). The parts add up to the window.",
                      _left_out(runs, gpu))
    section.blocks.append(TableBlock("GPU time per GPU", _stacked(gpu, _SUMMARY),
                                     "shares of the capture window; top causes: what the host was doing during the "
                                     "GPU's idle time, as shares of it."))
    for r in gpu:
        steps = r.db.query("iterations") if "nvtx_ranges" not in r.db.missing else None
        chart = gpu_charts.gpu_time_chart(r.db.query("gpu_time_idle"), r.db.query("gpu_time"), iterations=steps,
                                          origin_ns=r.start_ns)
        section.blocks.append(ChartBlock(_name("gpu-time", runs, r), chart,
                                         "Green: busy. Orange, red, grey: idle within, between and outside iterations. "
                                         "Each point is one bin of the window." + (
                                             " The strip above marks the steps: hover for a step's number and times."
                                             if r.has_trace else ""), r.label if len(runs) > 1 else ""))
    return section


def _idle_causes(runs: list[RunData], gpu: list[RunData]) -> Section:
    section = Section("gpu-idle", "Why the GPU sat idle",
                      "Each idle span is split by what the host was doing meanwhile: an NVTX leaf range on any "
                      "thread of the process that launched the GPU work (the thread that launched most wins where "
                      "several are in one), else the CUDA or HIP API call in flight on a launching thread "
                      "(cuda_sync: a synchronize or a synchronous copy; cuda_launch; cuda_graph_launch; "
                      "cuda_memcpy; cuda_memset; cuda_other), else the Python function that thread was in (python, "
                      "on a trace with stack frames), else unattributed.",
                      _left_out(runs, gpu))
    section.blocks.append(TableBlock("Idle time by host cause", _stacked(gpu, _CAUSES),
                                     f"per GPU, the {TOP_ROWS} causes that took the most idle time; idle share: of "
                                     "that GPU's idle time; spans: idle spans with some time of the cause."))
    for r in gpu:
        section.blocks.append(ChartBlock(_name("gpu-idle-causes", runs, r),
                                         gpu_charts.idle_causes_chart(r.db.query("gpu_time_causes")),
                                         "Each bar is one cause, split by the kind of idle time it fell in.",
                                         r.label if len(runs) > 1 else ""))
    return section


def _kernels(runs: list[RunData], gpu: list[RunData]) -> Section:
    section = Section("gpu-kernels", "GPU operations by time",
                      "The kernels (by short name), memcpys and memsets that took the most GPU time, over all GPUs; "
                      "their durations are summed, so work that overlaps on two streams counts twice here.",
                      _left_out(runs, gpu))
    section.blocks.append(TableBlock("Top GPU operations", _short_names(_stacked(gpu, _KERNELS)),
                                     "name: the kernel's short name (hover for the full one); share: of the summed "
                                     "durations of all GPU operations.", hover={"name": "full_name"}))
    for r in gpu:
        section.blocks.append(ChartBlock(_name("gpu-kernels", runs, r),
                                         gpu_charts.kernels_chart(r.db.query("gpu_time_kernels")),
                                         "Kernels by short name; hover for the full name, count and mean duration.",
                                         r.label if len(runs) > 1 else ""))
    return section


def _short_names(table: pa.Table) -> pa.Table:
    """gpu_time_kernels rows with each kernel's short name in `name` (a repeat within a run numbered, as the
    chart numbers it) and its full name in `full_name`."""
    names = table.column("name").to_pylist()
    runs = table.column("run").to_pylist() if "run" in table.column_names else [None] * len(names)
    short = [short_kernel_name(n) for n in names]
    for run in set(runs):
        rows = [i for i, r in enumerate(runs) if r == run]
        for i, label in zip(rows, distinct_labels([short[i] for i in rows])):
            short[i] = label
    at = table.column_names.index("name")
    return table.set_column(at, "name", pa.array(short, pa.string())).append_column(
        "full_name", pa.array(names, pa.string()))


def _repeating(runs: list[RunData], gpu: list[RunData], why: str = NO_GPU) -> Section:
    section = Section("nvtx-ranges", "NVTX ranges that repeat",
                      "The ranges that could be one iteration, ranked as `itertrace mapping suggest` ranks them: how "
                      "much of the GPU work they launch, how much of their thread's time they cover, how steady "
                      "their pace is. Each comes with the --param line that maps it.", _left_out(runs, gpu, why))
    for r in gpu:
        table = r.db.sql(_REPEATING)
        heading = f"{r.label}: " if len(runs) > 1 else ""
        if table.num_rows:
            section.blocks.append(TableBlock(f"{heading}Candidates for the iteration range", table,
                                             "gpu share: of the GPU operations launched inside the ranges; time share: "
                                             "of their thread's time; period: from one range's start to the next."))
        else:
            ranges = r.db.sql("SELECT count(*) AS n FROM nvtx_ranges").column(0)[0].as_py()
            section.blocks.append(NoteBlock(f"{heading}No NVTX range repeats at least 4 times in this capture "
                                            f"({ranges:,} NVTX ranges in all), so none maps an iteration."))
    return section
