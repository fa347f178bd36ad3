"""The overlap experiment's figures for one run, from its nsys capture or from its run logs, by the same queries.

- wall: from the first step's start to the last step's end (steps with a forward pass);
- host gaps: from the latest forward-pass end so far to the next forward pass's start, 0 where they
  overlap (host_gaps.sql's definition); gap share = their sum / wall;
- device time: the forward passes' total time (they never overlap one another), and their count;
- throughput: output tokens / wall; TPOT per request from the ends of the steps that sampled its
  tokens, (last - first) / (tokens - 1); percentiles linear (session.percentile);
- the prediction (a run without overlap): what_if_overlap.sql's model with `hide` the phases overlap
  mode takes off the critical path (overlap.hidden_phases).
  From run logs alone, the queries read the capture the log stands for: its steps, its phases end to end
  (as the engine times them) and its forward passes (queries/sources/run_log.sql).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

from itertrace.errors import UserError
from itertrace.profiler.session import percentile


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
    """A run's figures from its run logs alone, as from_capture gives them: the same queries, over the capture
    its log stands for (queries/sources/run_log.sql), in a database beside the run directory."""
    from itertrace.ingest.api import ingest

    db = run_dir.with_name(run_dir.name + ".duckdb")
    ingest([run_dir], db)
    return from_capture(db, run_dir, hide)


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
