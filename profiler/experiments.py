"""The scheduling experiments: the worked example (static vs continuous batching), stranded slot-time, and fairness under a short stream."""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from itertrace.errors import UserError
from itertrace.profiler.scheduling.policies import Policy
from itertrace.profiler.scheduling.request import Phase, PreemptKind
from itertrace.profiler.scheduling.scheduler import Mode
from itertrace.profiler.session import RunSpec, run, run_in_turn, summarize
from itertrace.profiler.runners.sim_runner import CostModel
from itertrace.profiler.workloads import VARIABLE_BLOCK, VARIABLE_LENGTHS, VARIABLE_PROBS, RequestSpec, build_requests
from itertrace.profiler.workloads import worked_example as we_specs
from itertrace.profiler.workloads import slot_time as slot_time_specs


def _dir(out: Path | None, name: str) -> Path | None:
    return None if out is None else Path(out) / name


def _stage(spec: RunSpec, text: str) -> None:
    """A line on stderr as each stage of a torch experiment starts: those take minutes, and the table
    comes only at the end. Simulated experiments take seconds and say nothing."""
    if spec.runner == "torch":
        print(f"  {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _all_ran(experiment: str, reqs) -> None:
    """The experiments' figures assume every request ran to its length: otherwise, say which did not and why."""
    for r in reqs:
        if r.phase is not Phase.FINISHED_LENGTH:
            raise UserError(f"experiment {experiment}: request {r.request_id} ended {r.phase.value} "
                            f"({r.stop_reason.value if r.stop_reason else 'no reason'}) under these flags, but the "
                            f"experiment needs every request to run to its length (see --num-blocks, --token-budget, "
                            f"--no-chunked-prefill)")


def worked_example(spec: RunSpec, out: Path | None = None) -> dict:
    """Eight requests together, seven of 32 tokens and one of 512, eight more waiting; static vs continuous."""
    rows = []
    for mode in (Mode.STATIC, Mode.CONTINUOUS):
        s = replace(spec, scheduler=replace(spec.scheduler, mode=mode, max_num_seqs=8))
        _stage(s, f"worked-example: {mode.value} batching")
        reqs = build_requests(we_specs(), seed=spec.seed)
        res = run(s, reqs, run_dir=_dir(out, f"worked-example-{mode.value}"), workload="worked-example",
                  keep_membership=True)
        _all_ran("worked-example", reqs)
        short_ids = [r.request_id for r in reqs[:7]]
        finish = {r.request_id: r.transitions[-1].iteration for r in reqs}
        held = sum(1 for it, members in enumerate(res.membership)
                   if all(i in members and finish[i] < it for i in short_ids))
        waiting = reqs[8:]
        summary = summarize(res, 8)
        rows.append({
            "mode": mode.value,
            "iterations": res.iterations,
            "short_finish_iteration": max(finish[i] for i in short_ids),
            "long_finish_iteration": finish[7],
            "iterations_finished_ids_held": held,
            "idle_slot_iterations": res.idle_slot_iterations,
            "idle_held_by_finished": res.idle_finished,
            "waiting_first_start": min(r.first_scheduled_iteration for r in waiting),
            "waiting_last_start": max(r.first_scheduled_iteration for r in waiting),
            "waiting_ttft_ms_mean": statistics.fmean(
                (res.times[r.request_id].first_token_ns - r.arrival_ns) / 1e6 for r in waiting),
            "throughput_tok_s": summary["throughput_tok_s"],
            "members_at": {str(it): res.membership[it] for it in (31, 32, 511) if it < len(res.membership)},
        })
    return {"experiment": "worked-example", "runner": spec.runner, "simulated": spec.runner == "simulated",
            "rows": rows}


def static_idle_prediction(lengths: list[int], capacity: int) -> int:
    """Slot-iterations static batching strands, from lengths alone: per batch, sum of (max - own)."""
    idle = 0
    for i in range(0, len(lengths), capacity):
        batch = lengths[i:i + capacity]
        idle += sum(max(batch) - n for n in batch) + (capacity - len(batch)) * max(batch)
    return idle


def slot_time(spec: RunSpec, n: int, out: Path | None = None, prompt_tokens: int = 32, in_turn: bool = False) -> dict:
    """Capacity 16, queue never empty, two workloads of mean output 128, static and continuous.

    With `in_turn` (for timed runners on a shared machine) the four runs go in one process, an
    iteration each in turn (session.run_in_turn), so that load from other processes, which changes
    one run's wall time by 10-30% here, falls on all four alike.
    """
    capacity = 16
    jobs, shapes = [], []
    for kind in ("uniform", "variable"):
        specs = slot_time_specs(kind, n, prompt_tokens, spec.seed)
        for mode in (Mode.STATIC, Mode.CONTINUOUS):
            s = replace(spec, scheduler=replace(spec.scheduler, mode=mode, max_num_seqs=capacity,
                                                max_num_batched_tokens=max(spec.scheduler.max_num_batched_tokens,
                                                                           capacity * prompt_tokens)))
            jobs.append((s, build_requests(specs, seed=spec.seed), _dir(out, f"slot-time-{kind}-{mode.value}"),
                         f"slot-time-{kind}"))
            shapes.append((kind, mode, [r.output_tokens for r in specs]))
    results = run_in_turn(jobs) if in_turn else [run(s, reqs, run_dir=d, workload=w) for s, reqs, d, w in jobs]
    for _, reqs, _, _ in jobs:
        _all_ran("slot-time", reqs)
    rows = []
    for (kind, mode, lengths), res in zip(shapes, results):
        row = {"workload": kind, "mode": mode.value, **summarize(res, capacity)}
        row["output_len_mean"] = statistics.fmean(lengths)
        row["output_len_stdev"] = statistics.pstdev(lengths)
        row["idle_share"] = res.idle_slot_iterations / max(1, res.iterations * capacity)
        if mode is Mode.STATIC:
            row["idle_predicted_from_lengths"] = static_idle_prediction(lengths, capacity)
        rows.append(row)
    ratios = {}
    for kind in ("uniform", "variable"):
        by_mode = {r["mode"]: r for r in rows if r["workload"] == kind}
        ratios[kind] = by_mode["continuous"]["throughput_tok_s"] / by_mode["static"]["throughput_tok_s"]
    return {"experiment": "slot-time", "runner": spec.runner, "simulated": spec.runner == "simulated",
            "requests_per_workload": n, "capacity": capacity, "in_turn": in_turn,
            "variable_lengths": {str(length): p for length, p in zip(VARIABLE_LENGTHS, VARIABLE_PROBS)},
            "variable_lengths_note": f"whole blocks of {VARIABLE_BLOCK} requests in these proportions"
                                     + (f", and {n % VARIABLE_BLOCK} more at 128 tokens" if n % VARIABLE_BLOCK else "")
                                     + ", so the mean is exactly 128",
            "rows": rows,
            "continuous_over_static": ratios, "conclusion": _conclusion(rows, ratios)}


def slot_time_runners(spec: RunSpec, n_torch: int, n_full: int, out: Path | None = None,
                      cost: CostModel | None = None) -> dict:
    """The slot-time experiment on the torch runner, beside the simulated runner with a cost model fitted here.

    The continuous/static ratio depends on the number of requests (the last static batches and the
    continuous run's drain weigh more in a short run), so the runners are compared at the same size;
    the simulated runner also runs at full size. The four torch runs go an iteration each in turn
    (see slot_time): on a shared machine one run's wall time varies by 10-30% with other processes'
    load, more than the agreement asked for. The schedule does not depend on time, so at the same
    size both runners run the same batches, and each run's simulated time against its torch time shows
    where the cost model and the torch runner part.
    """
    torch_spec = replace(spec, runner="torch")
    fit = None
    if cost is None:
        from itertrace.profiler.runners.calibrate import calibrate

        _stage(torch_spec, "slot-time: fitting the simulated runner's cost model to the torch runner")
        cost, fit = calibrate(torch_spec)
    # warm-up: the first forward passes of a process build kernels and fault in memory, which would
    # land in the first timed run (the uniform static one) alone
    _stage(torch_spec, "slot-time: a warm-up run")
    run(torch_spec, build_requests(slot_time_specs("variable", 16, 32, spec.seed + 1), seed=spec.seed))
    _stage(torch_spec, f"slot-time: the four torch runs of {n_torch} requests, an iteration each in turn")
    result = slot_time(torch_spec, n_torch, _dir(out, "torch"), in_turn=True)
    _stage(torch_spec, f"slot-time: the simulated runner at {n_torch} and {n_full} requests")
    sim_spec = replace(spec, runner="simulated", cost=cost)
    same = slot_time(sim_spec, n_torch, _dir(out, "simulated-same-size"))
    full = slot_time(sim_spec, n_full, _dir(out, "simulated-full-size"))
    torch_ratios, sim_ratios = result["continuous_over_static"], same["continuous_over_static"]
    ratio_of_ratios = {k: sim_ratios[k] / v for k, v in torch_ratios.items()}
    diffs = {k: abs(v - 1) for k, v in ratio_of_ratios.items()}
    sim_time = {(r["workload"], r["mode"]): r["wall_s"] for r in same["rows"]}
    result["agreement"] = {
        "cost_model": {"fixed_ns": cost.fixed_ns, "per_seq_ns": cost.per_seq_ns, "per_token_ns": cost.per_token_ns,
                       "per_context_token_ns": cost.per_context_token_ns, "source": cost.source},
        "fit": fit,
        "torch_ratios": torch_ratios,
        "simulated_ratios": sim_ratios,
        "ratio_of_ratios": ratio_of_ratios,
        "relative_diff": diffs,
        "max_rel_diff": max(diffs.values()),
        "run_time_simulated_over_torch": {f"{r['workload']} {r['mode']}": sim_time[(r["workload"], r["mode"])] / r["wall_s"]
                                          for r in result["rows"]},
        "torch_threads": _torch_threads(),
        "full_size_requests": n_full,
        "full_size_ratios": full["continuous_over_static"],
        "full_size_rows": full["rows"],
    }
    return result


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _conclusion(rows: list[dict], ratios: dict[str, float]) -> str:
    """The causal reading of the table, in words that follow its figures (a timed runner on a loaded
    machine can lose throughput to slower iterations even where continuous batching runs fewer)."""
    get = {(r["workload"], r["mode"]): r for r in rows}
    us, vs = get[("uniform", "static")], get[("variable", "static")]
    vc = get[("variable", "continuous")]
    per_iteration = {m: r["wall_s"] / max(1, r["iterations"]) * 1e3 for m, r in (("static", vs), ("continuous", vc))}
    if ratios["variable"] >= 1:
        outcome = f"x{ratios['variable']:.2f} throughput"
    else:
        outcome = (f"yet x{ratios['variable']:.2f} throughput, since its iterations took "
                   f"{per_iteration['continuous']:.2f} ms against static's {per_iteration['static']:.2f} ms on this run")
    return (
        f"The workloads have mean output {us['output_len_mean']:g} and {vs['output_len_mean']:g} tokens; only the "
        f"spread differs (stdev {us['output_len_stdev']:.0f} vs {vs['output_len_stdev']:.0f}). With uniform lengths every "
        f"static batch finishes together, so static strands {us['idle_slot_iterations']} slot-iterations and "
        f"continuous over static throughput is x{ratios['uniform']:.2f}. With variable lengths a static batch lives "
        f"as long as its longest member, so finished requests hold {vs['idle_held_by_finished']} slot-iterations "
        f"({100 * vs['idle_share']:.0f}% of all; {vs['idle_predicted_from_lengths']} predicted from the lengths "
        f"alone); continuous batching hands those slots to waiting requests at each finish iteration "
        f"({vc['idle_slot_iterations']} idle), finishing the same work in {vc['iterations']} instead of "
        f"{vs['iterations']} iterations: {outcome}. The recovered slot-time comes from output-length variance: "
        f"the wider the spread, the longer early finishers wait for the batch's max."
    )


LONG_AFTER = 4


def fairness(spec: RunSpec, shorts: int = 400, long_tokens: int = 512, gap_ms: float = 30.0,
             out: Path | None = None) -> dict:
    """A continuous stream of short requests and one long one, under FCFS, SRW and priority with aging."""
    rows = []
    variants = [("fcfs", Policy.FCFS, 64), ("srw", Policy.SRW, 64), ("priority", Policy.PRIORITY, 64),
                ("priority-no-aging", Policy.PRIORITY, 10**9)]
    for label, policy, aging in variants:
        sched = replace(spec.scheduler, mode=Mode.CONTINUOUS, policy=policy, max_num_seqs=8,
                        preemption=PreemptKind.RECOMPUTE, aging_iterations=aging)
        s = replace(spec, scheduler=sched, num_blocks=48, block_size=16)
        # Shorts (16-32 output tokens) arrive every `gap_ms`: 8 slots run near saturation, so a short is
        # usually waiting. The long request arrives after `LONG_AFTER` shorts, in a lower priority class.
        # 48 blocks of 16 tokens cannot hold the long request beside seven shorts: someone is preempted.
        specs = [RequestSpec(int(i * gap_ms * 1e6), 32, 16 + (i * 7) % 17) for i in range(shorts)]
        specs.insert(LONG_AFTER, RequestSpec(int((LONG_AFTER - 0.5) * gap_ms * 1e6), 32, long_tokens,
                                             priority=1, tenant="batch"))
        reqs = build_requests(specs, seed=spec.seed)
        long_req = reqs[LONG_AFTER]
        _stage(s, f"fairness: {label}")
        res = run(s, reqs, run_dir=_dir(out, f"fairness-{label}"), workload="fairness", keep_tokens=True)
        _all_ran("fairness", reqs)
        t = res.times[long_req.request_id]
        stall_ns, stall_it = _longest_stall(long_req, res)
        short_ttft = sorted((res.times[r.request_id].first_token_ns - r.arrival_ns) / 1e6
                            for r in reqs if r is not long_req and r.phase is Phase.FINISHED_LENGTH)
        rows.append({
            "policy": label,
            "long_completion_ms": (t.finish_ns - long_req.arrival_ns) / 1e6 if t.finish_ns else None,
            "long_first_token_ms": (t.first_token_ns - long_req.arrival_ns) / 1e6 if t.first_token_ns else None,
            "long_longest_stall_ms": stall_ns / 1e6,
            "long_longest_stall_iterations": stall_it,
            "long_preemptions": long_req.num_preemptions,
            "short_ttft_ms_p50": short_ttft[len(short_ttft) // 2],
            "short_ttft_ms_p99": short_ttft[int(len(short_ttft) * 0.99)],
            "iterations": res.iterations,
        })
    return {"experiment": "fairness", "runner": spec.runner, "simulated": spec.runner == "simulated",
            "short_requests": shorts, "short_gap_ms": gap_ms, "long_tokens": long_tokens, "rows": rows}


def _longest_stall(req, res) -> tuple[int, int]:
    """The longest wait between consecutive tokens (ns, iterations), from the first token on."""
    t = res.times[req.request_id]
    if len(t.token_ns) < 2:
        return 0, 0
    gaps_ns = [b - a for a, b in zip(t.token_ns, t.token_ns[1:])]
    gaps_it = [b - a for a, b in zip(t.token_iterations, t.token_iterations[1:])]
    return max(gaps_ns), max(gaps_it)
