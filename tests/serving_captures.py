"""Multi-step PyTorch profiler captures built from the one-step vLLM and SGLang traces in ../shared/serving_traces.

`build(name, steps, out_path)` writes a trace of `steps` copies of the named trace's events, each copy later
than the one before by the trace's span and a gap, with ids of its own: every id that links events or must
stay unique (`correlation`, `External id`, the flow events' `id`, `Python id`, `Python parent id`, `Ev Idx`)
moved past the largest of the copy before. The top-level keys are kept, and the text of each event is
kept as the trace writes it (times keep their digits: they are moved by whole microseconds).
"""
from __future__ import annotations

import gzip
import json
import re
import tempfile
from decimal import Decimal
from pathlib import Path

from itertrace.ingest.kineto_json import split_trace

SERVING = Path(__file__).resolve().parents[1].parent / "shared" / "serving_traces"
NAMES = ("vllm_decode_full_graph_step", "sglang_qwen3_8b_decode_step", "sglang_qwen3_8b_prefill_decode_step")
_IDS = re.compile(rb'("(?:correlation|External id|id|Python id|Python parent id|Ev Idx)": )(\d+)')
_TS = re.compile(rb'("ts": )(-?\d+(?:\.\d+)?)')
_END = re.compile(rb'"ts": (-?\d+(?:\.\d+)?)(?:, "dur": (\d+(?:\.\d+)?))?')


def path_of(name: str) -> Path:
    """The shared trace of that name."""
    return SERVING / f"{name}.json.gz"


def build(name: str, steps: int = 50, out_path: Path | None = None, gap_us: int = 1000,
          drop: frozenset[str] = frozenset()) -> Path:
    """`steps` copies of the shared trace `name` as one trace at `out_path` (gzipped if it ends in .gz), without
    the events of the categories in `drop`."""
    out_path = out_path or Path(tempfile.mkdtemp()) / f"{name}_x{steps}.json"
    return repeat(path_of(name), steps, out_path, gap_us, drop)


def repeat(source: Path, copies: int, out_path: Path, gap_us: int = 1000, drop: frozenset[str] = frozenset()) -> Path:
    """`copies` copies of the events of the trace at `source` (less those of the categories in `drop`), one after
    another, as one trace at `out_path`."""
    with tempfile.TemporaryDirectory() as work:
        events_file = Path(work) / "events.json"
        meta = split_trace(source, events_file).meta
        body = events_file.read_bytes().strip()[1:-1].strip().rstrip(b",")
    if drop:
        body = b", ".join(text for text, event in _events(body) if event.get("cat") not in drop)
    ends = [(Decimal(m[1].decode()), Decimal(m[2].decode() if m[2] else "0")) for m in _END.finditer(body)]
    first, last = min(ts for ts, _ in ends), max(ts + dur for ts, dur in ends)
    shift_us = int(last - first) + 1 + gap_us
    stride = 10 ** len(str(max((int(m[2]) for m in _IDS.finditer(body)), default=0)))
    opener = gzip.open if out_path.name.endswith(".gz") else open
    with opener(out_path, "wb") as sink:
        sink.write(b'{"traceEvents": [\n')
        for k in range(copies):
            copy = _TS.sub(lambda m: m[1] + str(Decimal(m[2].decode()) + k * shift_us).encode(), body) if k else body
            copy = _IDS.sub(lambda m: m[1] + str(int(m[2]) + k * stride).encode(), copy) if k else copy
            sink.write((b",\n" if k else b"") + copy)
        sink.write(b"\n]")
        for key, value in meta.items():
            sink.write(b", " + json.dumps(key).encode() + b": " + json.dumps(value).encode())
        sink.write(b"}\n")
    return out_path


def _events(body: bytes):
    """(text, event) of each event in `body`, the inside of an event array: the text exactly as written."""
    text, decoder, at = body.decode(), json.JSONDecoder(parse_float=Decimal), 0
    while at < len(text):
        event, end = decoder.raw_decode(text, at)
        yield text[at:end].encode(), event
        at = end
        while at < len(text) and text[at] in ", \n\r\t":
            at += 1
