"""Plain-text tables for the engine's commands."""
from __future__ import annotations


def table(headers: list[str], rows: list[list]) -> str:
    """Right-aligned columns; floats to 4 significant digits, None as '-'."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _label(runner: str, simulated: bool) -> str:
    return f"{runner} runner" + (" (SIMULATED: times come from a cost model)" if simulated else "")


def format_summary(s: dict, runner: str, run_dir: str) -> str:
    rows = [
        ["requests", s["requests"]], ["completed", s["completed"]], ["output tokens", s["output_tokens"]],
        ["iterations", s["iterations"]],
        *([["  of them run in bulk", s["iterations_in_bulk"]]] if s.get("iterations_in_bulk") else []),
        *([["tokens dropped (overlap)", s["tokens_dropped"]]] if s.get("tokens_dropped") else []),
        ["idle slot-iterations", s["idle_slot_iterations"]],
        ["  held by finished requests", s["idle_held_by_finished"]],
        ["throughput (tok/s)", s["throughput_tok_s"]],
        ["TTFT p50 / p99 (ms)", f"{_cell(s['ttft_ms_p50'])} / {_cell(s['ttft_ms_p99'])}"],
        ["TPOT p50 / p99 (ms)", f"{_cell(s['tpot_ms_p50'])} / {_cell(s['tpot_ms_p99'])}"],
        ["end-to-end p50 / p99 (ms)", f"{_cell(s['e2e_ms_p50'])} / {_cell(s['e2e_ms_p99'])}"],
    ]
    states = ", ".join(f"{k} {v}" for k, v in sorted(s["states"].items()))
    return (f"{_label(runner, s['simulated'])}\n" + table(["", "value"], rows)
            + f"\nfinal states: {states}\nrun logs: {run_dir}")


def format_experiment(result: dict) -> str:
    head = f"{result['experiment']}: {_label(result['runner'], result['simulated'])}"
    if result["experiment"] == "worked-example":
        cols = ["mode", "iterations", "short_finish_iteration", "iterations_finished_ids_held",
                "idle_slot_iterations", "idle_held_by_finished", "waiting_first_start", "waiting_last_start",
                "waiting_ttft_ms_mean", "throughput_tok_s"]
        body = table(cols, [[r[c] for c in cols] for r in result["rows"]])
        members = "\n".join(f"  {r['mode']:>10} batch at iteration {it}: {ids}"
                            for r in result["rows"] for it, ids in r["members_at"].items())
        return f"{head}\n{body}\nmembership:\n{members}"
    if result["experiment"] == "slot-time":
        cols = ["workload", "mode", "requests", "output_tokens", "iterations", "idle_slot_iterations",
                "throughput_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
                "e2e_ms_p50", "e2e_ms_p99"]
        body = table(cols, [[r[c] for c in cols] for r in result["rows"]])
        ratios = ", ".join(f"{k} x{v:.3f}" for k, v in result["continuous_over_static"].items())
        extra = ""
        if "agreement" in result:
            extra = "\n" + format_agreement(result)
        mix = ", ".join(f"{length} ({p:.0%})" for length, p in result["variable_lengths"].items())
        return (f"{head}\ncapacity {result['capacity']}, {result['requests_per_workload']} requests per workload; "
                f"uniform: 128 tokens each; variable: {mix}, {result['variable_lengths_note']}\n"
                f"{body}\ncontinuous/static throughput: {ratios}{extra}\n\n{result['conclusion']}")
    if result["experiment"] == "overlap":
        return f"{head}\n{format_overlap(result)}"
    cols = list(result["rows"][0])
    return f"{head}\n{table(cols, [[r[c] for c in cols] for r in result['rows']])}"


def _pct(v: float | None) -> str | None:
    return None if v is None else f"{100 * v:.1f}%"


SPLIT_KEYS = ("wall_change_ms_per_iteration", "host_hidden_ms_per_iteration", "device_change_ms_per_iteration",
              "forward_ms_off", "forward_ms_on")


def format_overlap(result: dict) -> str:
    """Each run's figures and the medians; then, per round, the prediction beside the measured run with overlap."""
    figure_cols = ["gap share", "gap p50 (us)", "gap p99 (us)", "throughput (tok/s)", "TPOT p50 (ms)",
                   "TPOT p99 (ms)"]
    keys = ["gap_share", "gap_p50_us", "gap_p99_us", "throughput_tok_s", "tpot_ms_p50", "tpot_ms_p99"]
    cell = lambda f, k: _pct(f[k]) if k == "gap_share" else f[k]  # noqa: E731
    runs = [[f"round {x['round'] + 1} {'on' if x['overlap'] else 'off'}", *(cell(x, k) for k in keys),
             x["tokens_dropped"]] for x in result["runs"]]
    med = result["median"]
    runs += [[f"median {mode}", *(cell(med[mode], k) for k in keys), None] for mode in ("off", "on")]
    rounds = [[f"round {r['round'] + 1}", r["throughput_gain"], r["predicted_throughput_gain"], r["forward_ms_off"],
               r["forward_ms_on"], r["throughput_tok_s"],
               r["predicted_throughput_tok_s"], _pct(r["prediction_error"]), r["predicted_tpot_ms_p50"],
               r["predicted_tpot_ms_p99"], r["tokens_identical"], r["tokens_dropped"]] for r in result["rounds"]]
    rounds.append(["median", med["throughput_gain"], med["predicted_throughput_gain"], med["forward_ms_off"],
                   med["forward_ms_on"], med["throughput_tok_s"],
                   med["predicted_throughput_tok_s"], _pct(med["prediction_error"]), med["predicted_tpot_ms_p50"],
                   med["predicted_tpot_ms_p99"], med["tokens_identical"], None])
    host = result.get("host_ns_per_iteration")
    setup = (f"{result['workload']}; capacity {result['capacity']}; {result['repeat']} round(s), each one run without "
             f"and one with overlap, the order swapped every round"
             + (f"; the cost model's host time {host / 1e6:g} ms per iteration" if host else ""))
    ratio = med["gap_share_ratio"]
    split = [[f"round {r['round'] + 1}", *(r[k] for k in SPLIT_KEYS), _pct(r["device_growth"]), r["throughput_gain"]]
             for r in result["rounds"]]
    # each column's own median: with rounds that differ, the medians need not add up as a round's parts do
    split.append(["median of each", *(med[k] for k in SPLIT_KEYS), _pct(med["device_growth"]), med["throughput_gain"]])
    m = result["machine"]
    return (f"{setup}\nfigures from the {result['source']}; gap share = {result['gap_share_definition']}\n"
            + table(["run", *figure_cols, "tokens dropped"], runs)
            + f"\nmedian host-gap share with overlap / without: {'-' if ratio is None else f'x{ratio:.3f}'}"
            + "\n\nwhere the change in wall time per iteration came from (wall = forward passes + exposed host "
              "time, so wall change = device change - host hidden):\n"
            + table(["round", "wall change (ms/it)", "host hidden (ms/it)", "device change (ms/it)",
                     "forward without (ms)", "forward with (ms)", "forward longer by", "gain measured"], split)
            + f"\n{m['cores']} cores, load (1 min) {m['load_1m_before']:.1f} before and {m['load_1m_after']:.1f} after"
            + (f"\nlikely cause: {result['likely_cause']}" if result["likely_cause"] else "")
            + f"\n\nwhat-if from each round's run without overlap (hide={result['hide']}: {result['hide_note']}), "
              f"beside its run with overlap; it assumes {result['what_if_assumes']} (forward as assumed, and as "
              f"measured with overlap):\n"
            + table(["round", "gain measured", "gain predicted", "forward assumed (ms)", "forward measured (ms)",
                     "tok/s measured", "tok/s predicted", "predicted/measured - 1",
                     "predicted TPOT p50", "predicted TPOT p99", "tokens identical", "tokens dropped"], rounds))


def format_agreement(result: dict) -> str:
    """The torch and simulated runners' continuous/static ratios side by side, and how far apart they are."""
    a = result["agreement"]
    c = a["cost_model"]
    fit = f", fit R^2 {a['fit']['r2']:.3f}" if a.get("fit") else ""
    rows = [[k, a["torch_ratios"][k], a["simulated_ratios"][k], f"{100 * (a['ratio_of_ratios'][k] - 1):+.1f}%"]
            for k in a["torch_ratios"]]
    times = ", ".join(f"{k} {100 * (v - 1):+.1f}%" for k, v in a["run_time_simulated_over_torch"].items())
    full = ", ".join(f"{k} x{v:.3f}" for k, v in a["full_size_ratios"].items())
    each = ", the four runs an iteration each in turn" if result.get("in_turn") else ""
    return (f"continuous/static throughput, torch runner ({a['torch_threads']} threads{each}) vs simulated runner at "
            f"the same size ({result['requests_per_workload']} requests per workload):\n"
            + table(["workload", "torch", "simulated", "simulated/torch - 1"], rows)
            + f"\nlargest difference: {100 * a['max_rel_diff']:.1f}%"
            + f"\ncost model fitted here (fixed {c['fixed_ns'] / 1e6:.2f} ms + {c.get('per_seq_ns', 0) / 1e3:.1f} us/sequence"
            f" + {c['per_token_ns'] / 1e3:.1f} us/token + {c['per_context_token_ns']:.1f} ns/context token{fit})"
            + f"\neach run's simulated time vs its torch time: {times}"
            + f"\nsimulated runner at full size ({a['full_size_requests']} requests per workload): {full}")
