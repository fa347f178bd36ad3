"""Workloads: the experiments' synthetic ones, Poisson/gamma arrivals, and trace files (Azure CSV, JSONL)."""
from __future__ import annotations

import calendar
import csv
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from itertrace.errors import UserError
from itertrace.profiler.scheduling.batch import SamplingParams
from itertrace.profiler.gcquiet import no_full_collections
from itertrace.profiler.scheduling.request import Request
from itertrace.profiler.workloads.tokenizer import EOS, SynthPrompt

# The variable workload: mean output length exactly 128, as the uniform one. The probabilities
# are whole counts in every 20 requests (4, 4, 3, 3, 3, 1, 1, 1), whose lengths add up to 20 x 128.
VARIABLE_LENGTHS = (8, 16, 32, 64, 128, 256, 512, 1024)
VARIABLE_PROBS = (0.20, 0.20, 0.15, 0.15, 0.15, 0.05, 0.05, 0.05)
VARIABLE_BLOCK = 20
# The longest prompt or output a workload may ask for, in tokens: lengths are stored as 32-bit integers
# by the runners, and no KV pool holds more.
MAX_LENGTH = 2**31 - 1
# Arrivals count ns from the first in int64 clocks, with room to spare: under 2^62 ns (146 years).
CLOCK_LIMIT_NS = 2**62


@dataclass(frozen=True)
class RequestSpec:
    """A request as a workload describes it: lengths and times, no tokens yet."""

    arrival_ns: int
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    tenant: str = "default"
    deadline_ns: int | None = None
    cancel_at_iteration: int | None = None


def build_requests(specs: list[RequestSpec], *, seed: int = 0, sampling: SamplingParams | None = None,
                   ignore_eos: bool = True) -> list[Request]:
    """Turn specs into requests with deterministic synthetic prompts; output length is max_tokens.

    Stop tokens default to EOS; with `ignore_eos` (fixed-length workloads) only max_tokens ends a request.
    """
    base = sampling or SamplingParams()
    with no_full_collections():  # millions of long-lived objects (see gcquiet)
        out = []
        for i, spec in enumerate(specs):
            request_seed = seed * 1_000_003 + i  # the request's prompt and sampling
            sp = replace(base, max_tokens=spec.output_tokens, stop_token_ids=base.stop_token_ids or (EOS,),
                         ignore_eos=ignore_eos, seed=base.seed + request_seed)
            out.append(Request(
                request_id=i, prompt_ids=SynthPrompt(spec.prompt_tokens, request_seed), sampling=sp,
                arrival_ns=spec.arrival_ns, priority=spec.priority, tenant=spec.tenant,
                deadline_ns=spec.deadline_ns, cancel_at_iteration=spec.cancel_at_iteration,
            ))
    return out


def worked_example(prompt_tokens: int = 16, waiting: int = 8, short: int = 32, long: int = 512) -> list[RequestSpec]:
    """Eight requests together: seven stop after `short` tokens, one after `long`; `waiting` more queue behind."""
    first = [RequestSpec(0, prompt_tokens, short) for _ in range(7)] + [RequestSpec(0, prompt_tokens, long)]
    return first + [RequestSpec(0, prompt_tokens, short) for _ in range(waiting)]


def variable_lengths(n: int, seed: int) -> list[int]:
    """`n` output lengths of the variable workload, shuffled by `seed`, whose mean is exactly 128 at any n:
    each whole block of 20 requests in the stated proportions, and the n mod 20 left over at 128."""
    counts = [round(p * VARIABLE_BLOCK) * (n // VARIABLE_BLOCK) for p in VARIABLE_PROBS]
    counts[VARIABLE_LENGTHS.index(128)] += n % VARIABLE_BLOCK
    values = [length for length, c in zip(VARIABLE_LENGTHS, counts) for _ in range(c)]
    random.Random(seed).shuffle(values)
    return values


def slot_time(kind: str, n: int, prompt_tokens: int = 32, seed: int = 0) -> list[RequestSpec]:
    """The stranded slot-time experiment at capacity 16: all requests queued at t=0 (the queue never empties early)."""
    if kind == "uniform":
        lengths = [128] * n
    elif kind == "variable":
        lengths = variable_lengths(n, seed)
    else:
        raise UserError(f"slot-time workload {kind!r}: expected 'uniform' or 'variable'")
    return [RequestSpec(0, prompt_tokens, out) for out in lengths]


def parse_lengths(text: str, what: str = "length distribution") -> tuple[str, tuple]:
    """A length distribution: `128`, `uniform:16:256`, or `choice:8,16,32@0.5,0.3,0.2`; `what` names it in errors."""
    try:
        if text.isdigit() and 1 <= int(text) <= MAX_LENGTH:
            return "fixed", (int(text),)
        kind, _, rest = text.partition(":")
        if kind == "uniform":
            lo, hi = (int(x) for x in rest.split(":"))
            if 1 <= lo <= hi <= MAX_LENGTH:
                return "uniform", (lo, hi)
        elif kind == "choice":
            values, _, probs = rest.partition("@")
            vals = tuple(int(v) for v in values.split(","))
            ps = tuple(float(p) for p in probs.split(",")) if probs else tuple(1 / len(vals) for _ in vals)
            if len(vals) == len(ps) and abs(sum(ps) - 1) < 1e-9 and 1 <= min(vals) and max(vals) <= MAX_LENGTH \
                    and min(ps) >= 0:
                return "choice", (vals, ps)
    except ValueError:
        pass
    raise UserError(f"{what} {text!r}: expected N, uniform:LO:HI or choice:A,B,..@PA,PB,.. "
                    f"(lengths at least 1 and at most {MAX_LENGTH}, probabilities not negative and summing to 1)")


def _draw(dist: tuple[str, tuple], rng: random.Random) -> int:
    kind, args = dist
    if kind == "fixed":
        return args[0]
    if kind == "uniform":
        return rng.randint(*args)
    return rng.choices(args[0], weights=args[1])[0]


def synthetic(n: int, *, rate: float, cv: float = 1.0, prompt: str = "128", output: str = "128",
              seed: int = 0) -> list[RequestSpec]:
    """`n` requests with gamma inter-arrival times (cv=1 is Poisson) at `rate` per second; rate 0 = all at once."""
    if n < 1 or not 0 <= rate < math.inf or not 0 < cv < math.inf:  # NaN fails both
        raise UserError(f"synthetic workload: need n >= 1, rate >= 0, cv > 0, rate and cv finite "
                        f"(got n={n}, rate={rate}, cv={cv})")
    rng = random.Random(seed)
    p_dist, o_dist = parse_lengths(prompt), parse_lengths(output)
    shape = 1.0 / (cv * cv) if cv * cv > 0 else math.inf
    if not 0 < shape < math.inf:
        raise UserError(f"--cv {cv:g}: the gamma shape 1/cv^2 is not a positive finite number; "
                        "give a cv from 1e-150 to 1e150")
    t, specs = 0.0, []
    for _ in range(n):
        if not t * 1e9 < CLOCK_LIMIT_NS or rate > 0 and not rate * shape > 0:  # (a gap of 1 / 0)
            fastest = (n - 1) / (CLOCK_LIMIT_NS / 1e9)
            raise UserError(f"--rate {rate:g}: {n:,} requests arriving at {rate:g} per second reach past the engine's "
                            f"clock (146 years); give at least {fastest:.2g} per second, or 0 for all at once")
        specs.append(RequestSpec(int(t * 1e9), _draw(p_dist, rng), _draw(o_dist, rng)))
        if rate > 0:
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
    return specs


def load_trace(path: Path, *, limit: int | None = None, time_scale: float = 1.0) -> list[RequestSpec]:
    """Read an Azure LLM trace CSV or a JSONL trace; arrivals start at 0 and are divided by `time_scale`.

    A length of 0 (a request that failed or was cut off upstream) runs as 1 token, the least the engine
    can run; a note on stderr says how many there were."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such workload file")
    reader = _read_azure_csv if path.suffix.lower() == ".csv" else _read_jsonl
    try:
        rows = reader(path, limit)
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None
    if not rows:
        raise UserError(f"{path}: no requests in the file")
    t0 = min(t for t, _, _ in rows)
    span = (max(t for t, _, _ in rows) - t0) / time_scale
    if not span < CLOCK_LIMIT_NS:
        raise UserError(f"{path}: arrivals span {span / 1e9 / 86400 / 365.25:.3g} years after --time-scale "
                        f"{time_scale:g}; the engine's clock holds under 146")
    zeros = sum(1 for _, p, o in rows if not p or not o)
    if zeros:
        print(f"itertrace: note: {path}: {zeros} request(s) with 0 prompt or output tokens run with 1",
              file=sys.stderr)
    return [RequestSpec(int((t - t0) / time_scale), max(1, p), max(1, o)) for t, p, o in rows]


class _BadValue(ValueError):
    """One field of a trace row, and what is wrong with it."""


def _field(rec: dict, name: str, parse: Callable[[object], int]) -> int:
    """rec[name] parsed, or _BadValue naming the field, its value and what was expected."""
    if name not in rec or rec[name] is None:
        raise _BadValue(f"no {name}")
    try:
        return parse(rec[name])
    except (TypeError, ValueError, OverflowError) as exc:
        raise _BadValue(f"{name} {rec[name]!r}: {exc}") from None


def _read_azure_csv(path: Path, limit: int | None) -> list[tuple[int, int, int]]:
    rows = []
    with path.open(newline="", encoding="utf-8-sig") as fh:  # a byte-order mark is not part of the first name
        reader = csv.reader(fh)
        header = next(reader, [])
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(header)
        if missing:
            raise UserError(f"{path}: not an Azure LLM trace: missing column(s) {', '.join(sorted(missing))}")
        for fields in reader:
            if limit is not None and len(rows) >= limit:
                break
            if not fields:  # a blank line
                continue
            try:
                if len(fields) != len(header):
                    raise _BadValue(f"{len(fields)} fields, the header has {len(header)}")
                rec = dict(zip(header, fields))
                rows.append((_field(rec, "TIMESTAMP", _azure_timestamp_ns), _field(rec, "ContextTokens", _length),
                             _field(rec, "GeneratedTokens", _length)))
            except _BadValue as exc:
                raise UserError(f"{path}:{reader.line_num}: bad row: {exc}") from None
    return rows


def _length(value: object) -> int:
    """A token count from a trace: a whole number, not negative (load_trace runs 0 as 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("expected a whole number of tokens")
    if isinstance(value, float) and not value.is_integer():  # JSON 3.7: int() would cut it to 3
        raise ValueError("not a whole number")
    try:
        length = int(value)
    except ValueError:
        raise ValueError("expected a whole number of tokens") from None
    if length < 0:
        raise ValueError("a length cannot be negative")
    if length > MAX_LENGTH:
        raise ValueError(f"at most {MAX_LENGTH} tokens")
    return length


def _in_range(ns: int) -> int:
    """A timestamp in ns that the engine's int64 clocks hold with room to spare (under 146 years from 1970)."""
    if not -CLOCK_LIMIT_NS < ns < CLOCK_LIMIT_NS:
        raise ValueError("out of the range the engine's clock holds (1824 to 2116)")
    return ns


def _azure_timestamp_ns(text: object) -> int:
    """An Azure TIMESTAMP, 'YYYY-MM-DD HH:MM:SS.fffffff' (UTC, 100 ns digits), to integer ns since the Unix epoch."""
    whole, _, frac = str(text).strip().partition(".")
    try:
        secs = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        raise ValueError("expected a time like YYYY-MM-DD HH:MM:SS.fffffff") from None
    if frac and not frac.isdigit():
        raise ValueError("expected a time like YYYY-MM-DD HH:MM:SS.fffffff")
    return _in_range(secs * 1_000_000_000 + int((frac + "000000000")[:9]))


def _ms_timestamp_ns(value: object) -> int:
    """A JSONL timestamp in milliseconds to integer ns."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("expected a finite number of milliseconds")
    return _in_range(int(float(value) * 1_000_000))


_JSONL_FIELDS = "; expected one object per line with timestamp (ms), input_length, output_length"


def _read_jsonl(path: Path, limit: int | None) -> list[tuple[int, int, int]]:
    rows = []
    with path.open(encoding="utf-8-sig") as fh:
        for line_no, line in enumerate(fh, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise _BadValue(f"not JSON ({exc.msg} at character {exc.pos + 1}){_JSONL_FIELDS}") from None
                except RecursionError:
                    raise _BadValue(f"nested too deeply to be a row{_JSONL_FIELDS}") from None
                if not isinstance(rec, dict):
                    raise _BadValue(f"a JSON {type(rec).__name__}, not an object{_JSONL_FIELDS}")
                rows.append((_field(rec, "timestamp", _ms_timestamp_ns), _field(rec, "input_length", _length),
                             _field(rec, "output_length", _length)))
            except _BadValue as exc:
                raise UserError(f"{path}:{line_no}: {exc}") from None
    return rows
