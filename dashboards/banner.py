"""The report's banner line for a capture: which engine's steps the mapping found, how many, named how, and how
the mapping was chosen (or that it found none, and where to look for one)."""
from __future__ import annotations

from pathlib import Path

from itertrace.queries.api import QueryDB
from itertrace.queries.presets import GENERIC, presets

# Engines as people write them (presets.toml names them in lower case).
ENGINE_TITLES = {"itertrace": "itertrace's reference engine", "vllm": "vLLM", "sglang": "SGLang",
                 "trtllm": "TensorRT-LLM"}

_STEPS = """
SELECT count(*) AS steps, count(DISTINCT i.global_tid) AS threads, min(i.iteration) AS first, max(i.iteration) AS last,
       mode(regexp_replace(r.text, '[0-9]+', '#', 'g')) AS name
FROM iterations AS i JOIN nvtx_ranges AS r ON r.range_id = i.step_range_id"""


def mapping_line(db: QueryDB, path: Path, source_kind: str | None) -> str:
    """One line for the top of the report (backticks mark code), e.g. "vLLM (torch profiler annotations): 20 steps,
    0 to 19, each a range named `execute_#_context_#(...)`; mapping chosen automatically; the same explicitly:
    `--param preset=vllm`." """
    if "nvtx_ranges" in db.missing or not db.sql("SELECT count(*) FROM nvtx_ranges").column(0)[0].as_py():
        return "No steps: the capture holds no NVTX range, annotation or stack frame, so no range can stand for one."
    choice = db.mapping_choice
    steps, threads, first, last, name = db.sql(_STEPS).to_pylist()[0].values()
    if not steps:
        why = db.mapping_note() or ("auto found no range that repeats like an iteration"
                                    if choice is not None else "the mapping given matches no range")
        return (f"No steps: {why}, so no chart marks steps. `itertrace mapping suggest --db {path}` ranks the "
                "ranges that could be one iteration, each with the --param line that maps it.")
    preset = db.sql("SELECT preset, step_pattern FROM mapping").to_pylist()[0]
    row = next((p for p in presets() if p.name == preset["preset"]), None)
    kineto = source_kind == "kineto"
    if row is None:  # the generic mapping: a range of the program's own
        what = "Steps of the program's own range" if choice is None else "Steps of the best suggested range"
        names = "a range"
    else:
        source = ("Python stack frames" if row.ranges == "frames" else "torch profiler annotations" if kineto
                  else "NVTX ranges")
        what = f"{ENGINE_TITLES.get(row.engine, row.engine)} ({source})"
        names = "a frame" if row.ranges == "frames" else "a range"
    where = f" on {threads} threads" if threads > 1 else ""
    span = f"1 step, {names}" if steps == 1 else f"{steps:,} steps{where}, numbered {first} to {last}, each {names}"
    line = f"{what}: {span} named `{name}`; "
    if choice is None:
        return line + (f"mapping given: `--param preset={row.name}`." if row else
                       f"mapping given: `--param preset={GENERIC}` with step_pattern `{preset['step_pattern']}`.")
    how = "chosen automatically" if choice.asked == "auto" else f"chosen for --param preset={choice.asked}"
    return line + f"mapping {how}; the same explicitly: `{choice.param_line}`."
