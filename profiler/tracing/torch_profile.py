"""`itertrace run --torch-profile DIR`: the run recorded by torch.profiler, its trace written into DIR.

The engine's NVTX ranges become `torch.profiler` ranges of the same names (user_annotation events in
the trace), so `itertrace ingest DIR/trace.json.gz` gives the same `nvtx_ranges` as an nsys capture and
the queries' `itertrace` preset reads them. Kineto has no payloads and no domains; so:

- each range that carries a payload (the `step` range's iteration, a mark's request id) is opened with
  that integer as its one argument (`torch.autograd._record_function_with_args_enter`), which the
  trace keeps as `args["Concrete Inputs"]` because the profiler records shapes: the ingest reads it
  into `nvtx_ranges.int64_value`;
- the trace's top-level key `itertrace` names the domain of its ranges, and the names of the ranges
  that stand for NVTX marks (zero-length ranges: Kineto records no instant events from Python), which
  the ingest files under `nvtx_marks`.

Python stack frames are recorded too (`with_stack=True`, as vLLM's and SGLang's profilers do by default),
so the trace has the shape of theirs: the ingest nests the ranges with the frames (`Engine.iteration`'s
frame holds each `step` range).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import torch

from itertrace.errors import UserError
from itertrace.profiler.tracing.nvtx_ranges import (ADMIT, ARRIVE, DOMAIN, FINISH, STEP, TOKENS, PhaseName, StepTimes, Tracer,
                                            tokens_text)

TRACE_NAME = "trace.json.gz"
MARKS = (ARRIVE, ADMIT, FINISH, TOKENS)  # a `tokens` mark's text goes on: `tokens +3,4 -1`
_enter = torch.autograd._record_function_with_args_enter
_exit = torch.autograd._record_function_with_args_exit


class _PhaseRange:
    """A phase's timed NVTX range and its profiler range, entered and left together; reusable."""

    __slots__ = ("_nvtx", "_name", "_handle")

    def __init__(self, nvtx_range, name: str) -> None:
        self._nvtx, self._name, self._handle = nvtx_range, name, None

    def __enter__(self) -> None:
        self._nvtx.__enter__()
        self._handle = _enter(self._name)

    def __exit__(self, *exc) -> None:
        _exit(self._handle)
        self._nvtx.__exit__(*exc)


class ProfiledTracer(Tracer):
    """The engine's tracer, each range and mark also a torch.profiler range of the same name.

    Steps run one after the other (push/pop): overlap mode's start/end steps are not offered, since a
    profiler range nests on its thread.
    """

    def __init__(self, clock) -> None:
        super().__init__(clock)
        self._profiled = {p: _PhaseRange(self._phases[p], p.value) for p in PhaseName}
        self._steps: list[object] = []  # the open step range's handle

    def start_step(self, iteration: int) -> StepTimes:
        times = super().start_step(iteration)
        self._steps.append(_enter(STEP, iteration))
        return times

    def end_step(self) -> None:
        _exit(self._steps.pop())
        super().end_step()

    def open_step(self, iteration: int):
        raise RuntimeError("a torch.profiler trace cannot hold overlapping steps; run without --overlap")

    def phase(self, name: PhaseName, times: StepTimes) -> _PhaseRange:
        super().phase(name, times)  # points the phase's timed range at this step's times
        return self._profiled[name]

    def mark(self, name: str, request_id: int) -> None:
        super().mark(name, request_id)
        _exit(_enter(name, request_id))

    def tokens(self, iteration: int, added, removed) -> None:
        super().tokens(iteration, added, removed)
        _exit(_enter(tokens_text(added, removed), iteration))


def check_folder(folder: Path) -> None:
    """UserError unless `folder` can take the trace: new, or an empty folder."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"--torch-profile {folder}: already exists and is not an empty folder; choose another")


@contextmanager
def profiled(folder: Path, device: str | None) -> Iterator[type[ProfiledTracer]]:
    """Record what runs inside with torch.profiler (CPU, and CUDA on a CUDA run); write FOLDER/trace.json.gz.

    The trace appears only when the block completes; on a failure nothing is left in FOLDER.
    """
    check_folder(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{TRACE_NAME}.partial.json.gz"  # export_chrome_trace gzips a name ending .gz
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    pa.array([0])  # pyarrow imports pandas on its first array, where installed: not while frames are recorded
    try:
        with torch.profiler.profile(activities=activities, record_shapes=True, with_stack=True) as prof:
            prof.add_metadata_json("itertrace", json.dumps({"domain": DOMAIN, "marks": list(MARKS)}))
            yield ProfiledTracer  # made by the run, over its clock
        prof.export_chrome_trace(str(partial))
        os.replace(partial, folder / TRACE_NAME)
    except BaseException:
        partial.unlink(missing_ok=True)
        if made:
            folder.rmdir()
        raise
