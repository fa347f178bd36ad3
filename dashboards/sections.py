"""The report's sections, each from the views its runs' databases can serve; a note for what they cannot."""
from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa

from itertrace.dashboards.batch_charts import active_tokens_chart, slot_time_chart
from itertrace.dashboards.blocks import ChartBlock, NoteBlock, RunData, Section, TableBlock
from itertrace.dashboards.chart_data import label_runs
from itertrace.dashboards.gpu_sections import gpu_sections
from itertrace.dashboards.latency_charts import ClassKind, fairness_progress_chart, latency_cdf_chart
from itertrace.dashboards.membership import membership_chart
from itertrace.dashboards.overlap_charts import overlap_section
from itertrace.dashboards.trace_charts import host_gap_chart, iteration_timeline_chart

DETAIL_ITERATIONS = 200  # a binned membership chart is followed by its first iterations in detail


def sections(runs: list[RunData]) -> list[Section]:
    """Every section, in page order, that at least notes something for these runs."""
    built = (*gpu_sections(runs), _gaps(runs), _timeline(runs), overlap_section(runs), _membership(runs), _slot_time(runs), _active(runs),
             _latency(runs), _fairness(runs), _agreement(runs))
    return [s for s in built if s is not None]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"


def _name(chart: str, runs: list[RunData], run: RunData) -> str:
    """A chart's file-name-safe name: the chart, and the run's label when the report compares runs."""
    return f"{chart}-{_slug(run.label)}" if len(runs) > 1 else chart


def _heading(runs: list[RunData], run: RunData) -> str:
    """The run's label above its own chart when the report compares runs; none for a single run."""
    return run.label if len(runs) > 1 else ""


def _stack(runs: list[RunData], rows: Callable[[RunData], pa.Table]) -> pa.Table:
    """Rows of several runs with a `run` label column; without it for a single run."""
    table = label_runs([(r.label, rows(r)) for r in runs], "run")
    return table.drop_columns(["run"]) if len(runs) == 1 else table


NO_TRACE = ("no Nsight Systems trace in the database: a simulated run has none; ingest a run's .nsys-rep beside its "
            "run directory to see its host gaps")
NO_STEPS = ("its trace has no iteration (step) ranges that the mapping recognises (`itertrace mapping suggest --db "
            "FILE` ranks the ranges that could be one)")
NO_LOG = "no engine run log in the database; ingest the run directory beside the trace"
NO_DEVICE = ("its iterations have no device interval, so nothing lies between them: no GPU work was launched "
             "inside its step ranges and no range stands for the device (a CPU-only trace names one with "
             "`--param device_pattern=...`, e.g. '^forward$')")


def _note(runs: list[RunData], reasons: dict[str, str | None]) -> NoteBlock | None:
    """One note naming the runs a section leaves out, grouped by reason; None when it leaves none out."""
    by_reason: dict[str, list[str]] = {}
    for r in runs:
        if reasons.get(r.label):
            by_reason.setdefault(reasons[r.label], []).append(r.label)
    if not by_reason:
        return None
    parts = []
    for reason, labels in by_reason.items():
        who = "" if len(runs) == 1 else ("any run: " if len(labels) == len(runs) else f"{', '.join(labels)}: ")
        parts.append(who + reason)
    return NoteBlock("Not shown for " + "; ".join(parts) + "." if len(runs) > 1 else "Not shown: " + parts[0] + ".")


def _trace_note(runs: list[RunData]) -> NoteBlock | None:
    return _note(runs, {r.label: NO_TRACE if "nvtx_ranges" in r.db.missing else None if r.has_trace else NO_STEPS
                        for r in runs})


def _log_note(runs: list[RunData]) -> NoteBlock | None:
    return _note(runs, {r.label: None if r.has_log else NO_LOG for r in runs})


def _gaps(runs: list[RunData]) -> Section:
    section = Section("host-gaps", "Host gaps between device iterations",
                      "A host gap is the time from one iteration's device work ending to the next one's starting: the "
                      "device sits idle while the host schedules, prepares, samples and detokenizes. Each gap is "
                      "split by the host phases (NVTX ranges) that overlap it; what no phase covers is "
                      "`unattributed`, so the parts of a gap add up to the gap.")
    traced = [r for r in runs if r.has_trace]
    if note := _trace_note(runs):
        section.blocks.append(note)
    gapless = {r.label for r in traced if not r.db.query("host_gaps_summary").num_rows}
    if note := _note(runs, {r.label: NO_DEVICE if r.label in gapless else None for r in runs}):
        section.blocks.append(note)  # empty tables and charts would say less than why they are empty
    traced = [r for r in traced if r.label not in gapless]
    if not traced:
        return section
    section.blocks += [
        TableBlock("Gaps per track", _stack(traced, lambda r: r.db.query("host_gaps_summary")),
                   "gap share: the share of wall time (first device start to last device end) the device sat idle "
                   "between iterations."),
        TableBlock("Gap time by host phase", _stack(traced, lambda r: r.db.query("host_gaps_by_phase")),
                   "per phase, its time in gaps over all gaps (a gap without the phase counts as 0)."),
        TableBlock("Longest gaps", _stack(traced, lambda r: r.db.query("host_gaps_worst")),
                   "the ten longest gaps, with the iterations around each and the part that took most of it."),
    ]
    for r in traced:
        section.blocks.append(ChartBlock(
            _name("host-gaps", runs, r), host_gap_chart(r.db.query("host_gaps_parts")),
            "Top: each iteration's gap stacked by host phase (dark grey: unattributed). Bottom: the distribution "
            "of each phase's time per gap. Hover for iteration numbers and times.", _heading(runs, r)))
    return section


def _timeline(runs: list[RunData]) -> Section | None:
    traced = [r for r in runs if r.has_trace]
    if not traced:
        return None
    section = Section("timeline", "Iteration timeline",
                      "Each iteration's host interval (its step range) and device interval (the GPU work it "
                      "launched, or on a CPU run its forward range), in time since the capture started. White space "
                      "in the device lane is a host gap. Drag to pan and scroll to zoom; the first view shows the "
                      "first iterations.")
    for r in traced:
        section.blocks.append(ChartBlock(
            _name("timeline", runs, r),
            iteration_timeline_chart(r.db.query("iterations"), origin_ns=r.start_ns),
            "Host step (light) and device interval (dark) per iteration.", _heading(runs, r)))
    return section


def _logged(runs: list[RunData]) -> list[RunData]:
    return [r for r in runs if r.has_log]


def _membership(runs: list[RunData]) -> Section | None:
    logged = _logged(runs)
    if not logged:
        return Section("membership", "Batch membership", "", [_log_note(runs)])
    section = Section("membership", "Batch membership",
                      "Who held each slot of the batch in each iteration, from the run log. Under static batching a "
                      "finished request keeps its slot until the batch's longest member finishes: those slots (dark "
                      "grey) do no work. Continuous batching hands them to waiting requests at the next iteration. "
                      "A request keeps the slot it entered; a newcomer takes the lowest free one.")
    if note := _log_note(runs):
        section.blocks.append(note)
    for r in logged:
        members, its = r.db.query("membership"), r.db.query("membership_iterations")
        chart = membership_chart(members, its)
        binned = bool(chart.usermeta["itertrace"]["binned"])
        section.blocks.append(ChartBlock(_name("membership", runs, r), chart, "Slots by iteration" + (
            f"; the first {DETAIL_ITERATIONS} iterations follow in detail." if binned else "."), _heading(runs, r)))
        if binned:
            first = r.db.sql(f"SELECT * FROM membership WHERE iteration < (SELECT min(iteration) FROM membership) "
                             f"+ {DETAIL_ITERATIONS}")
            first_its = r.db.sql(f"SELECT * FROM membership_iterations WHERE iteration < "
                                 f"(SELECT min(iteration) FROM membership_iterations) + {DETAIL_ITERATIONS}")
            section.blocks.append(ChartBlock(
                _name("membership-first", runs, r), membership_chart(first, first_its),
                f"The first {DETAIL_ITERATIONS} iterations in detail, one colour per request.",
                f"{_heading(runs, r) or r.label}: the first {DETAIL_ITERATIONS} iterations"))
    return section


def _slot_time(runs: list[RunData]) -> Section | None:
    logged = _logged(runs)
    if not logged:
        return None
    table = label_runs([(r.label, r.db.query("membership_slot_time")) for r in logged], "run")
    workloads = [str(r.meta.get("workload") or "") for r in logged]  # membership_slot_time has one row per run
    table = table.add_column(1, "workload", pa.array(workloads, pa.string()))
    pairs = list(zip(table.column("workload").to_pylist(), table.column("mode").to_pylist()))
    by = "mode" if len(set(pairs)) == len(pairs) else "run"
    section = Section("slot-time", "Slot-time",
                      "Every slot of every iteration that ran, by what it did: working (its request ran tokens), "
                      "finished (held by a finished request: stranded slot-time), stalled (a live member that ran "
                      "nothing) or empty. Idle is everything but working.")
    section.blocks += [
        TableBlock("Slot-iterations", table if len(runs) > 1 else table.drop_columns(["run"]),
                   "iterations and slot-iterations count only iterations that ran a forward pass."),
        ChartBlock("slot-time", slot_time_chart(table, mode=by),
                   "one bar per run, grouped by workload; the label gives the idle share and the iterations the "
                   "workload took."),
    ]
    return section


def _active(runs: list[RunData]) -> Section | None:
    logged = _logged(runs)
    if not logged:
        return None
    table = label_runs([(r.label, r.db.query("membership_iterations")) for r in logged], "run")
    return Section("active-tokens", "Active tokens per iteration",
                   "Tokens each iteration ran (prefill and decode), on a symlog axis so one decode token per slot "
                   "stays readable beside prefill spikes." + (" All runs share the axes." if len(logged) > 1 else ""),
                   [ChartBlock("active-tokens", active_tokens_chart(table),
                               "hover for working, finished and empty slots per iteration.")])


_LATENCY_SUMMARY = """
SELECT count(*) AS requests, count(first_token_ns) AS with_first_token,
       quantile_disc(queue_ns, 0.5) AS queue_p50_ns,
       quantile_disc(ttft_ns, 0.5) AS ttft_p50_ns, quantile_disc(ttft_ns, 0.9) AS ttft_p90_ns,
       quantile_disc(ttft_ns, 0.99) AS ttft_p99_ns,
       quantile_disc(tpot_ns, 0.5) AS tpot_p50_ns, quantile_disc(tpot_ns, 0.9) AS tpot_p90_ns,
       quantile_disc(tpot_ns, 0.99) AS tpot_p99_ns,
       quantile_disc(e2e_ns, 0.5) AS e2e_p50_ns, quantile_disc(e2e_ns, 0.99) AS e2e_p99_ns
FROM request_latency_log"""


def _latency(runs: list[RunData]) -> Section | None:
    logged = _logged(runs)
    if not logged:
        return None
    requests = label_runs([(r.label, r.db.query("latency_by_class_requests")) for r in logged], "run")
    section = Section("latency", "Request latency",
                      "From the run log: a token exists when the iteration that sampled it ends. TTFT is first token "
                      "minus arrival; TPOT is (last token minus first token) / (tokens minus 1).")
    section.blocks += [
        TableBlock("Latency summary", _stack(logged, lambda r: r.db.sql(_LATENCY_SUMMARY))),
        TableBlock("Latency by class", _stack(logged, lambda r: r.db.query("latency_by_class")).drop_columns(
            ["class_order"]),
                   "per prompt-length bucket, priority and tenant (nearest-rank percentiles)."),
        ChartBlock("latency-cdf", latency_cdf_chart(requests),
                   "CDFs of TTFT and TPOT per prompt-length bucket, one curve per run (log time axis)."),
    ]
    for kind, column in ((ClassKind.PRIORITY, "priority"), (ClassKind.TENANT, "tenant")):
        if len(set(requests.column(column).to_pylist())) > 1:
            section.blocks.append(ChartBlock(f"latency-cdf-{column}", latency_cdf_chart(requests, by=kind),
                                             f"the same CDFs per {column}."))
    return section


def _fairness(runs: list[RunData]) -> Section | None:
    logged = _logged(runs)
    if not logged:
        return None
    progress = label_runs([(r.label, r.db.query("fairness_progress")) for r in logged], "run")
    followed = _stack(logged, lambda r: r.db.sql(
        "SELECT f.* FROM fairness AS f SEMI JOIN fairness_progress AS p ON p.request_id = f.request_id"))
    return Section("fairness", "Fairness: the longest request's progress",
                   "Whether the longest request keeps advancing while a stream of others is served: its tokens over "
                   "time since it arrived, and how many other requests shared each of its iterations.", [
                       TableBlock("The followed request", followed,
                                  "longest stall: the longest time (and iterations) between two of its tokens."),
                       ChartBlock("fairness-progress", fairness_progress_chart(progress),
                                  "one line per run; hover for iterations and waits."),
                   ])


_AGREEMENT = """
SELECT count(*) AS requests,
       count(*) FILTER (WHERE output_tokens_log IS NOT NULL AND output_tokens_trace IS NOT NULL) AS in_both,
       count(*) FILTER (WHERE output_tokens_log IS DISTINCT FROM output_tokens_trace) AS token_count_mismatches,
       max(intake_delay_ns) AS intake_delay_max_ns,
       max(abs(queue_diff_ns)) AS queue_diff_max_ns, max(abs(ttft_diff_ns)) AS ttft_diff_max_ns,
       max(abs(tpot_diff_ns)) AS tpot_diff_max_ns, max(itl_abs_diff_max_ns) AS itl_diff_max_ns,
       max(abs(e2e_diff_ns)) AS e2e_diff_max_ns
FROM request_latency_compare"""


def _agreement(runs: list[RunData]) -> Section | None:
    both = [r for r in runs if r.has_log and r.has_trace]
    if not both:
        return None
    return Section("log-vs-trace", "Run log and trace agree?",
                   "The same latencies computed twice, from the engine's log and from the nsys trace alone, both "
                   "measured from intake (the trace cannot see a request before the engine takes it in). The "
                   "differences are the largest absolute ones over all requests.",
                   [TableBlock("request_latency_compare, summarised", _stack(both, lambda r: r.db.sql(_AGREEMENT)))])
