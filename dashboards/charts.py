"""Chart functions: each takes a query's table (pyarrow Table or pandas DataFrame) and returns an Altair chart.

Nothing here shows or saves a chart. Each function reduces its input before it reaches the chart
(its docstring says how), so a run of hundreds of thousands of iterations embeds a few thousand
rows at most. Times are shown in milliseconds. Charts of several runs take one table with a label
column; `label_runs` makes it from one table per run.
"""
from __future__ import annotations

from itertrace.dashboards.batch_charts import active_tokens_chart, slot_time_chart
from itertrace.dashboards.chart_data import label_runs
from itertrace.dashboards.gpu_charts import gpu_time_chart, idle_causes_chart, kernels_chart
from itertrace.dashboards.latency_charts import ClassKind, fairness_progress_chart, latency_cdf_chart
from itertrace.dashboards.membership import membership_chart
from itertrace.dashboards.trace_charts import (
    host_gap_chart,
    host_gap_distribution_chart,
    host_gap_iterations_chart,
    iteration_timeline_chart,
)

__all__ = [
    "ClassKind",
    "active_tokens_chart",
    "fairness_progress_chart",
    "gpu_time_chart",
    "host_gap_chart",
    "host_gap_distribution_chart",
    "host_gap_iterations_chart",
    "idle_causes_chart",
    "iteration_timeline_chart",
    "kernels_chart",
    "label_runs",
    "latency_cdf_chart",
    "membership_chart",
    "slot_time_chart",
]
