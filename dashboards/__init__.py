"""itertrace.dashboards: Altair chart functions over the query library's tables, and the HTML report.

Public API (each chart function takes a query's table, pyarrow or pandas, and returns an Altair
chart; nothing shows or saves itself):

- host_gap_chart(parts) / host_gap_iterations_chart(parts) / host_gap_distribution_chart(parts):
  host_gaps_parts, the gap per iteration stacked by phase and each phase's distribution over gaps
- iteration_timeline_chart(iterations, origin_ns=None): host and device intervals per iteration (iterations)
- gpu_time_chart(idle, gpu_time, iterations=None, origin_ns=None): each GPU's window binned over time by busy
  and idle kind (gpu_time_idle), with a strip of the steps above it given `iterations`
- capture_start_ns(db): the capture's start on its own clock, the `origin_ns` at which time axes read 0
- idle_causes_chart(causes): GPU idle time by host cause, split by kind (gpu_time_causes)
- kernels_chart(kernels): GPU operations by time (gpu_time_kernels)
- membership_chart(membership, membership_iterations): iteration by slot, coloured by request
- active_tokens_chart(iterations, label="run"): membership_iterations of several runs, one line each
- latency_cdf_chart(requests, label="run", by=ClassKind.PROMPT_BUCKET): latency_by_class_requests
- fairness_progress_chart(progress, label="run"): fairness_progress of several runs
- slot_time_chart(slot_time, workload="workload", mode="mode"): membership_slot_time of several runs
- label_runs(tables, column="run"): one table of several runs' rows with a label column
- build_report(dbs, labels=None, title=None) -> Report; write_report(report, out, png_dir=None) -> Written;
  render_html(report) -> str
"""
from __future__ import annotations

from itertrace.lazy import lazy_exports

# The package's one export list: where each public name lives, imported on first use (itertrace.lazy).
_HOMES = {
    "ClassKind": "latency_charts", "fairness_progress_chart": "latency_charts", "latency_cdf_chart": "latency_charts",
    "active_tokens_chart": "batch_charts", "slot_time_chart": "batch_charts", "label_runs": "chart_data",
    "host_gap_chart": "trace_charts", "host_gap_distribution_chart": "trace_charts",
    "host_gap_iterations_chart": "trace_charts", "iteration_timeline_chart": "trace_charts",
    "gpu_time_chart": "gpu_charts", "idle_causes_chart": "gpu_charts", "kernels_chart": "gpu_charts",
    "membership_chart": "membership",
    "capture_start_ns": "time_axis",
    "Report": "blocks", "build_report": "report",
    "Written": "html", "render_html": "html", "write_report": "html",
}

__getattr__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
