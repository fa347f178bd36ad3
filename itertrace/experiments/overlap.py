"""`itertrace experiment overlap`: the worked example with overlap mode off and on, side by side.

Each round runs the workload once without and once with overlap (the order swapped every round, so
that a drift in the machine's load falls on both alike). A torch run is profiled with nsys where it
is installed and its figures come from the capture through the query library (host_gaps,
request_latency_trace, what_if_overlap); a simulated run, or a torch run without nsys, gives them
from its run logs, through the same queries over the capture its log stands for. The run without overlap also gives
the what-if prediction of the run with it, which stands beside the measured one.
"""
from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from itertrace.errors import UserError
from itertrace.experiments.overlap_figures import from_capture, from_run_dir
from itertrace.profiler.session import RunSpec, run
from itertrace.profiler.workloads import build_requests, worked_example

# The simulated runner's host time per iteration when no --cost file is given: half the default cost
# model's fixed 8 ms, so that overlap has host work to hide and the device still takes the longer part.
SIM_HOST_NS = 4_000_000.0
# What overlap mode takes off the critical path (profiler/overlap.py): schedule and prepare of N+1,
# detokenize and postprocess of N run while the device computes; sample waits for it, unless the
# runner chains iterations (hidden_phases).
HIDDEN = ("schedule", "prepare", "detokenize", "postprocess")
HIDDEN_CHAINED = ("schedule", "prepare", "sample", "detokenize", "postprocess")
FIGURES = ("gap_share", "gap_p50_us", "gap_p99_us", "throughput_tok_s", "tpot_ms_p50", "tpot_ms_p99")
SPLIT = ("wall_change_ms_per_iteration", "host_hidden_ms_per_iteration", "device_change_ms_per_iteration",
         "forward_ms_off", "forward_ms_on", "device_growth")
# Forward passes this much longer with overlap than without are named as the likely cause of a lost gain.
DEVICE_GROWTH_NOTED = 0.05


def overlap(spec: RunSpec, repeat: int = 1, out: Path | None = None, profile: bool = True) -> dict:
    """`repeat` rounds of the worked example without and with overlap; per run figures, medians, and the prediction."""
    spec = _with_host_time(spec)
    source, hide = _source(spec, profile), hidden_phases(spec)
    load_before, runs = os.getloadavg()[0], []
    with tempfile.TemporaryDirectory(prefix="itertrace-overlap-") as tmp:
        base = Path(out) if out is not None else Path(tmp)
        for r in range(repeat):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                name = f"overlap-{'on' if on else 'off'}-{r}"
                _stage(spec, f"overlap: round {r + 1} of {repeat}, overlap {'on' if on else 'off'}")
                runs.append({"round": r, "overlap": on, "name": name,
                             **_one_run(replace(spec, overlap=on), base / name, source, None if on else hide)})
    if out is None:  # the captures went with the temporary folder
        for x in runs:
            x["db"] = None
    rounds = [_compare(r, [x for x in runs if x["round"] == r]) for r in range(repeat)]
    median = _medians(runs, rounds)
    machine = {"cores": len(os.sched_getaffinity(0)), "load_1m_before": load_before, "load_1m_after": os.getloadavg()[0]}
    return {"experiment": "overlap", "runner": spec.runner, "simulated": spec.runner == "simulated",
            "workload": "the worked example: 16 requests; of the first eight, seven stop at 32 tokens and one "
                        "runs to 512; eight more of 32 tokens wait",
            "capacity": spec.scheduler.max_num_seqs, "repeat": repeat, "source": source,
            "host_ns_per_iteration": spec.cost.host_ns if spec.runner == "simulated" else None,
            "hide": ",".join(hide), "hide_note": _hide_note(hide),
            "gap_share_definition": "host gaps (from each forward pass's end to the next one's start, none "
                                    "counted where they overlap) over wall time from the first step's start to "
                                    "the last step's end",
            "what_if_assumes": "each forward pass takes as long as in the run without overlap, and the hidden "
                               "phases run entirely while the device computes",
            "machine": machine, "likely_cause": likely_cause(spec, median["device_growth"], source, machine),
            "runs": runs, "rounds": rounds, "median": median}


def hidden_phases(spec: RunSpec) -> tuple[str, ...]:
    """The phases overlap mode takes off the critical path in this run: HIDDEN_CHAINED where the torch runner
    chains iterations (TorchRunner.chains: on the CPU, every row greedy, as in the worked example), else HIDDEN."""
    if spec.runner != "torch":
        return HIDDEN
    from itertrace.profiler.runners.torch.torch_runner import TorchRunner

    device = spec.model.device or ("cuda" if _cuda() else "cpu")
    return HIDDEN_CHAINED if hasattr(TorchRunner, "chains") and device == "cpu" else HIDDEN


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _hide_note(hide: tuple[str, ...]) -> str:
    if "sample" in hide:
        return ("overlap mode runs schedule and prepare of iteration N+1 while the device computes N, and launches "
                "N+1 before sampling N (the runner chains them), so sample, detokenize and postprocess of N run "
                "while the device computes N+1 (profiler/overlap.py)")
    return ("overlap mode runs schedule and prepare of iteration N+1, and detokenize and postprocess of N, while "
            "the device computes; only sample waits for it (profiler/overlap.py)")


def _with_host_time(spec: RunSpec) -> RunSpec:
    """The simulated runner needs host time to hide: the default cost model gets SIM_HOST_NS; a --cost file
    without any is refused, as overlap would have nothing to do."""
    if spec.runner != "simulated":
        return spec
    if spec.cost.source == "default" and not spec.cost.host_ns:
        return replace(spec, cost=replace(spec.cost, host_ns=SIM_HOST_NS))
    if not spec.cost.host_ns:
        raise UserError("experiment overlap: the --cost file's host_ns is 0, so the simulated host does no work "
                        "for overlap to hide; set host_ns (ns per iteration) in the file, or leave out --cost")
    return spec


def _source(spec: RunSpec, profile: bool) -> str:
    """'nsys capture' for a torch run where nsys is installed (and profiling was not turned off), else 'run logs'."""
    if spec.runner != "torch" or not profile:
        return "run logs"
    from itertrace.ingest.nsys import find_nsys

    try:
        find_nsys(None)
    except UserError:
        return "run logs"
    return "nsys capture"


def _stage(spec: RunSpec, text: str) -> None:
    """A line on stderr as each torch run starts (they take tens of seconds each); simulated runs say nothing."""
    if spec.runner == "torch":
        print(f"  {text}", file=sys.stderr, flush=True)


def _one_run(spec: RunSpec, folder: Path, source: str, hide: tuple[str, ...] | None) -> dict:
    """One run into `folder` (its run logs in folder/run, its capture beside them); its figures."""
    if source == "nsys capture":
        from itertrace.ingest.profile import profile_command

        command = [sys.executable, "-m", "itertrace.cli", "run", "--workload", "worked-example", *run_flags(spec)]
        try:
            result = profile_command(command, folder, echo=io.StringIO())
        except UserError as exc:  # seen here with other nsys sessions running beside: once in six runs
            print(f"itertrace: {exc}; profiling this run once more", file=sys.stderr, flush=True)
            result = profile_command(command, folder, echo=io.StringIO())
        return {"db": str(result.db), **from_capture(result.db, result.run_dir, hide)}
    run(spec, build_requests(worked_example(), seed=spec.seed), run_dir=folder / "run", workload="worked-example")
    return {"db": None, **from_run_dir(folder / "run", hide)}


def run_flags(spec: RunSpec) -> list[str]:
    """`itertrace run` flags that make `spec` again (a torch spec: the simulated runner's --cost has no flag)."""
    s, m = spec.scheduler, spec.model
    flags = ["--runner", spec.runner, "--mode", s.mode.value, "--policy", s.policy.value,
             "--capacity", str(s.max_num_seqs), "--token-budget", str(s.max_num_batched_tokens),
             "--decode-reserve", str(s.decode_reserve), "--preemption", s.preemption.value,
             "--aging", str(s.aging_iterations), "--block-size", str(spec.block_size),
             "--num-blocks", str(spec.num_blocks), "--swap-blocks", str(spec.swap_blocks),
             "--hidden", str(m.hidden_size), "--layers", str(m.num_layers), "--heads", str(m.num_heads),
             "--kv-heads", str(m.num_kv_heads), "--intermediate", str(m.intermediate_size), "--seed", str(spec.seed)]
    flags += [] if s.chunked_prefill else ["--no-chunked-prefill"]
    flags += ["--threads", str(m.threads)] if m.threads is not None else []
    flags += ["--checkpoint", m.checkpoint] if m.checkpoint else []
    flags += ["--device", m.device] if m.device else []
    return flags + (["--overlap"] if spec.overlap else [])


def likely_cause(spec: RunSpec, device_growth: float, source: str, machine: dict) -> str | None:
    """Why the forward passes took longer with overlap, where they did by more than DEVICE_GROWTH_NOTED; else None."""
    if device_growth <= DEVICE_GROWTH_NOTED:
        return None
    longer = f"the forward passes took {device_growth:.0%} longer with overlap"
    if spec.runner == "torch" and (spec.model.device or ("cuda" if _cuda() else "cpu")) == "cpu":
        beside = "the host thread" + (" and the profiler" if source == "nsys capture" else "")
        return (f"{longer}: on the CPU the device is a thread of this process, which shares the "
                f"{machine['cores']} cores with {beside} and whatever else runs (load "
                f"{machine['load_1m_before']:.1f} before, {machine['load_1m_after']:.1f} after); the what-if assumes "
                f"they take as long as without overlap")
    return f"{longer}; the what-if assumes they take as long as without overlap"


def split(off: dict, on: dict) -> dict:
    """The change in wall time per iteration, the host time overlap hid and the change in device time.

    A run's wall time is its device time (the forward passes) plus its exposed host time (the rest); so
    wall(on) - wall(off) = device change - host hidden, where host hidden is the exposed host time that
    went. Per iteration: over the run without overlap's forward passes (the same batches with overlap)."""
    n = off["forward_passes"]
    hidden = (off["wall_s"] - off["device_s"]) - (on["wall_s"] - on["device_s"])
    return {"wall_change_ms_per_iteration": (on["wall_s"] - off["wall_s"]) / n * 1e3,
            "host_hidden_ms_per_iteration": hidden / n * 1e3,
            "device_change_ms_per_iteration": (on["device_s"] - off["device_s"]) / n * 1e3,
            "forward_ms_off": off["device_s"] / n * 1e3,
            "forward_ms_on": on["device_s"] / on["forward_passes"] * 1e3,
            "device_growth": on["device_s"] / off["device_s"] - 1}


def _compare(r: int, pair: list[dict]) -> dict:
    """One round: the run with overlap against the one without, and against its prediction."""
    off, on = (next(x for x in pair if x["overlap"] is want) for want in (False, True))
    predicted = off["predicted"]
    gain, predicted_gain = on["throughput_tok_s"] / off["throughput_tok_s"], predicted["speedup"]
    return {
        **split(off, on),
        "round": r,
        "tokens_identical": off["tokens"] == on["tokens"],
        "requests_differing": sorted(k for k in off["tokens"] if off["tokens"][k] != on["tokens"].get(k)),
        "tokens_dropped": on["tokens_dropped"],
        "gap_share_ratio": on["gap_share"] / off["gap_share"] if off["gap_share"] else None,
        "throughput_gain": gain,
        "predicted_throughput_gain": predicted_gain,
        "throughput_tok_s": on["throughput_tok_s"],
        "predicted_throughput_tok_s": predicted["throughput_tok_s"],
        "prediction_error": predicted["throughput_tok_s"] / on["throughput_tok_s"] - 1,
        "predicted_tpot_ms_p50": predicted["tpot_ms_p50"],
        "predicted_tpot_ms_p99": predicted["tpot_ms_p99"],
    }


def _medians(runs: list[dict], rounds: list[dict]) -> dict:
    """Each figure's median over the runs of each mode, and over the rounds for their comparisons."""
    out = {mode: {f: statistics.median(x[f] for x in runs if x["overlap"] is (mode == "on")) for f in FIGURES}
           for mode in ("off", "on")}
    for key in ("throughput_gain", "predicted_throughput_gain", "prediction_error", "predicted_throughput_tok_s",
                "throughput_tok_s", *SPLIT,
                "predicted_tpot_ms_p50", "predicted_tpot_ms_p99"):
        out[key] = statistics.median(r[key] for r in rounds)
    out["gap_share_ratio"] = out["on"]["gap_share"] / out["off"]["gap_share"] if out["off"]["gap_share"] else None
    out["tokens_identical"] = all(r["tokens_identical"] for r in rounds)
    return out
