"""The overlap experiment's figures for one run, from its nsys capture or from its run logs, by one set of definitions.

- wall: from the first step's start to the last step's end (steps with a forward pass);
- host gaps: from the latest forward-pass end so far to the next forward pass's start, 0 where they
  overlap (host_gaps.sql's definition); gap share = their sum / wall;
- device time: the forward passes' total time (they never overlap one another), and their count;
- throughput: output tokens / wall; TPOT per request from the ends of the steps that sampled its
  tokens, (last - first) / (tokens - 1); percentiles linear (session.percentile);
- the prediction (a run without overlap): what_if_overlap.sql's model with `hide` the phases overlap
  mode takes off the critical path (overlap.hidden_phases).
  From a capture the query computes it; from run logs `predict_from_log` does, on the logged phase
  durations (the same model, step for step: see the query's header for why each term is what it is).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

from itertrace.errors import UserError
from itertrace.profiler.session import percentile

_TOKEN_KINDS = ("first_token", "token")


def from_capture(db: Path, run_dir: Path, hide: tuple[str, ...] | None) -> dict:
    """A profiled run's figures through the queries host_gaps, request_latency_trace and what_if_overlap; with
    `hide`, the prediction hiding those phases."""
    from itertrace.queries import QueryDB

    predict = hide is not None
    with QueryDB(db, params={"hide": ",".join(hide or ())}) as q:
        gaps = [r["gap_ns"] for r in q.sql("SELECT gap_ns FROM host_gaps").to_pylist()]
        tracks = q.sql("SELECT tokens, wall_ns, predicted_wall_ns FROM what_if_overlap_summary").to_pylist()
        device = q.sql("SELECT count(*) AS n, coalesce(sum(device_dur_ns), 0)::BIGINT AS ns FROM iterations "
                       "WHERE device_start_ns IS NOT NULL").to_pylist()[0]
        if len(tracks) != 1:
            raise UserError(f"{db}: expected the steps of one engine thread, found {len(tracks)} tracks")
        tpot = _column(q, "SELECT tpot_ns FROM request_latency_trace WHERE tpot_ns IS NOT NULL")
        predicted_tpot = _column(q, "SELECT predicted_tpot_ns FROM what_if_overlap_requests "
                                    "WHERE predicted_tpot_ns IS NOT NULL") if predict else []
    s = tracks[0]
    figures = _figures(gaps, s["wall_ns"], s["tokens"], tpot, device["ns"], device["n"])
    if predict:
        figures["predicted"] = _prediction(s["tokens"], s["wall_ns"], s["predicted_wall_ns"], predicted_tpot)
    return {**figures, **_outputs(run_dir)}


def _column(q, sql: str) -> list[float]:
    return [next(iter(r.values())) for r in q.sql(sql).to_pylist()]


def from_run_dir(run_dir: Path, hide: tuple[str, ...] | None) -> dict:
    """A run's figures from its run logs (iterations.parquet and events.parquet), as from_capture gives them."""
    rows = pq.read_table(run_dir / "iterations.parquet").to_pylist()
    rows.sort(key=lambda r: (r["start_ns"], r["iteration"]))
    busy = [r for r in rows if r["device_start_ns"] is not None]
    if not busy:
        raise UserError(f"{run_dir}: no iteration ran a forward pass")
    events = pq.read_table(run_dir / "events.parquet", columns=["request_id", "iteration", "kind"]).to_pylist()
    token_its: dict[int, list[int]] = {}
    for e in events:
        if e["kind"] in _TOKEN_KINDS:
            token_its.setdefault(e["request_id"], []).append(e["iteration"])
    ends = {r["iteration"]: r["end_ns"] for r in busy}
    wall = max(ends.values()) - busy[0]["start_ns"]
    tokens = sum(len(its) for its in token_its.values())
    device = sum(r["device_end_ns"] - r["device_start_ns"] for r in busy)
    figures = _figures(host_gaps(busy), wall, tokens, _tpots(token_its, ends), device, len(busy))
    if hide is not None:
        predicted_ends = predict_from_log(rows, hide)
        predicted_wall = max(predicted_ends.values()) - busy[0]["start_ns"]
        figures["predicted"] = _prediction(tokens, wall, predicted_wall, _tpots(token_its, predicted_ends))
    return {**figures, **_outputs(run_dir)}


def host_gaps(busy: list[dict]) -> list[int]:
    """Per forward pass after the first (in start order): the time since the latest end before it, 0 if none."""
    order = sorted(busy, key=lambda r: (r["device_start_ns"], r["iteration"]))
    gaps, reach = [], order[0]["device_end_ns"]
    for r in order[1:]:
        gaps.append(max(0, r["device_start_ns"] - reach))
        reach = max(reach, r["device_end_ns"])
    return gaps


def predict_from_log(rows: list[dict], hide: tuple[str, ...]) -> dict[int, int]:
    """Each iteration's predicted end, by what_if_overlap.sql's model, from a run log's rows in start order.

    predicted(N) = max(device(N), hidden(N+1)) + exposed(N); a run of iterations starts at the first
    one and after a step without a forward pass, its first iteration exposing all of its host time,
    its start kept as measured. The log's phase durations stand for the trace's phase ranges."""
    periods, prev = [], None  # prev: the step before, None after a step without a forward pass
    for r in rows:
        if r["device_start_ns"] is None:
            prev = None
            continue
        first = prev is None
        start = r["start_ns"] if first else prev["end_ns"]
        device = max(0, min(r["device_end_ns"], r["end_ns"]) - max(r["device_start_ns"], start))
        hidden = sum(r[f"{p}_ns"] or 0 for p in hide)
        periods.append({"it": r["iteration"], "first": first, "start": start, "device": device, "hidden": hidden,
                        "exposed": r["end_ns"] - start - device - (0 if first else hidden)})
        prev = r
    ends, at = {}, 0
    for i, p in enumerate(periods):
        nxt = periods[i + 1] if i + 1 < len(periods) else None
        hidden_next = nxt["hidden"] if nxt is not None and not nxt["first"] else 0
        at = (p["start"] if p["first"] else at) + max(p["device"], hidden_next) + p["exposed"]
        ends[p["it"]] = at
    return ends


def _tpots(token_its: dict[int, list[int]], ends: dict[int, int]) -> list[float]:
    """Per request with 2 tokens or more: (last token's step end - first's) / (tokens - 1)."""
    out = []
    for its in token_its.values():
        if len(its) > 1:
            times = [ends[i] for i in its]
            out.append((max(times) - min(times)) / (len(its) - 1))
    return out


def _figures(gaps: list[int], wall_ns: int, tokens: int, tpot_ns: list[float], device_ns: int,
             forward_passes: int) -> dict:
    return {
        "wall_s": wall_ns / 1e9,
        "device_s": device_ns / 1e9,
        "forward_passes": forward_passes,
        "output_tokens": tokens,
        "gap_share": sum(gaps) / wall_ns,
        "gap_p50_us": _scaled(percentile(gaps, 50), 1e3),
        "gap_p99_us": _scaled(percentile(gaps, 99), 1e3),
        "throughput_tok_s": tokens / wall_ns * 1e9,
        "tpot_ms_p50": _scaled(percentile(tpot_ns, 50), 1e6),
        "tpot_ms_p99": _scaled(percentile(tpot_ns, 99), 1e6),
    }


def _prediction(tokens: int, wall_ns: int, predicted_wall_ns: int, tpot_ns: list[float]) -> dict:
    return {"wall_s": predicted_wall_ns / 1e9, "speedup": wall_ns / predicted_wall_ns,
            "throughput_tok_s": tokens / predicted_wall_ns * 1e9,
            "tpot_ms_p50": _scaled(percentile(tpot_ns, 50), 1e6),
            "tpot_ms_p99": _scaled(percentile(tpot_ns, 99), 1e6)}


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value / unit


def _outputs(run_dir: Path) -> dict:
    """Per request, its output token count and a digest of its text (requests.parquet), and the tokens dropped."""
    reqs = pq.read_table(run_dir / "requests.parquet", columns=["request_id", "output_tokens", "text"]).to_pylist()
    summary = json.loads((run_dir / "run.json").read_text())["summary"]
    return {"tokens_dropped": summary.get("tokens_dropped", 0),
            "tokens": {str(r["request_id"]): f"{r['output_tokens']}:{_digest(r['text'])}" for r in reqs}}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
