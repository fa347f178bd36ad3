"""NVTX names are an API: the queries find the engine's phases by these exact strings.

Every iteration is a `step` push/pop range in domain `itertrace` whose int64 payload is the
iteration number; inside it, one range per phase. Request arrival, first admission and finish are
marks whose payload is the request id. A `tokens` mark (payload = iteration) says, whenever it
changes, which requests got a token in that iteration, so a trace alone rebuilds each request's
token times: see `tokens_text`.

In overlap mode (the host schedules iteration N+1 while the device runs N) consecutive steps overlap
in time, so each `step` is a start/end range instead, opened when its schedule phase starts and
closed when its postprocess ends, with the same payload. The host phases stay push/pop ranges on the
engine's thread; the forward pass is a `forward` range whose int64 payload is the iteration, on the
thread that runs the device work, and the queries find an iteration's device interval by that
number rather than by thread (queries/iterations.sql).
"""
from __future__ import annotations

import enum
import os
from nvtx._lib import EventAttributes
from nvtx._lib import end_range as _end
from nvtx._lib import mark as _mark
from nvtx._lib import pop_range as _pop
from nvtx._lib import push_range as _push
from nvtx._lib import start_range as _start
import nvtx

DOMAIN = "itertrace"
STEP = "step"  # one per iteration; payload = iteration number
ARRIVE = "arrive"  # mark; payload = request id
FINISH = "finish"  # mark; payload = request id (finished, canceled or rejected)
ADMIT = "admit"  # mark inside the step that first schedules the request; payload = request id
TOKENS = "tokens"  # mark inside a step whose set of token-getting requests changed; payload = iteration


class PhaseName(enum.Enum):
    """The host phases of one iteration, in the order they run."""

    SCHEDULE = "schedule"
    PREPARE = "prepare"  # block tables, positions, slot mapping (and KV swaps)
    FORWARD = "forward"
    SAMPLE = "sample"
    DETOKENIZE = "detokenize"
    POSTPROCESS = "postprocess"


PHASES: tuple[str, ...] = tuple(p.value for p in PhaseName)
_FORWARD = list(PhaseName).index(PhaseName.FORWARD)

_COLORS = {STEP: "green", "schedule": "blue", "prepare": "cyan", "forward": "red", "sample": "orange",
           "detokenize": "purple", "postprocess": "yellow", ARRIVE: "darkgreen", FINISH: "white",
           ADMIT: "darkgreen"}


class StepTimes:
    """One iteration's clock readings (ns): when it started, and when each phase's range closed and, for
    phases of overlapping iterations (`opened`), when it opened."""

    __slots__ = ("start_ns", "starts", "ends")

    def __init__(self, start_ns: int, opened: bool = False) -> None:
        self.start_ns = start_ns
        self.starts: list[int | None] | None = [None] * len(PHASES) if opened else None  # by PhaseName order
        self.ends: list[int | None] = [None] * len(PHASES)

    def back_to_back(self) -> tuple[int, tuple[int, ...]]:
        """(end, ns per phase) of phases that ran one after the other: each from the last one's end, so
        that they add up to the iteration; a phase that did not run takes 0 at the last one's end."""
        s, (a, b, c, d, e, f) = self.start_ns, self.ends
        if f is not None:  # every phase ran (the engine runs them all or schedule alone)
            return f, (a - s, b - a, c - b, d - c, e - d, f - e)
        durations, last = [], s
        for end in self.ends:
            end = last if end is None else end
            durations.append(end - last)
            last = end
        return last, tuple(durations)

    def device_span(self) -> tuple[int, int]:
        """The forward pass's (start, end) of phases that ran one after the other, as back_to_back counts it."""
        return self.ends[_FORWARD - 1], self.ends[_FORWARD]

    def forward_interval(self) -> tuple[int, int]:
        """When the forward range opened and closed (overlap mode: on the thread that ran the device work)."""
        return self.starts[_FORWARD], self.ends[_FORWARD]

    def last_end(self) -> int:
        """When the last phase to close closed."""
        return max(end for end in self.ends if end is not None)

    def measured(self) -> tuple[int, ...]:
        """ns per phase, each from its range's opening to its closing (phases of overlapping iterations)."""
        return tuple(0 if start is None else end - start for start, end in zip(self.starts, self.ends))


class _Range:
    """A reusable push/pop context manager for one phase (cheaper than contextlib's): it reads the clock
    just after its range closes (and, for a StepTimes that keeps openings, just before it opens) into the
    StepTimes it was handed."""

    __slots__ = ("_attrs", "_handle", "_index", "_now", "starts", "ends")

    def __init__(self, attrs, handle, index: int, now) -> None:
        self._attrs, self._handle, self._index, self._now = attrs, handle, index, now
        self.starts: list | None = None  # the StepTimes' lists it writes into (see Tracer.phase)
        self.ends: list | None = None

    def __enter__(self) -> None:
        if self.starts is not None:
            self.starts[self._index] = self._now()
        _push(self._attrs, self._handle)

    def __exit__(self, *exc) -> None:
        _pop(self._handle)
        self.ends[self._index] = self._now()


class _DeviceRange(_Range):
    """One forward pass's `forward` range (its payload the iteration), made for each pass."""

    __slots__ = ()

    def __init__(self, attrs, handle, times: StepTimes, now) -> None:
        super().__init__(attrs, handle, _FORWARD, now)
        self.starts, self.ends = times.starts, times.ends

    def span(self, start_ns: int, end_ns: int) -> None:
        """A device on a virtual clock (the simulated runner) ran from start_ns to end_ns: those are its times,
        and its range is emitted at once, as a trace of the process sees it."""
        _push(self._attrs, self._handle)
        _pop(self._handle)
        self.starts[_FORWARD], self.ends[_FORWARD] = start_ns, end_ns


class Tracer:
    """Emits this engine's NVTX ranges and marks, reading `clock` at their edges; phase attributes are built once."""

    def __init__(self, clock) -> None:
        self._now = clock.now_ns
        self._domain = nvtx.get_domain(DOMAIN)
        self._handle = self._domain.handle
        self._phases = {p: _Range(self._attrs(p.value), self._handle, i, self._now) for i, p in enumerate(PhaseName)}

    def _attrs(self, name: str, payload: int | None = None):
        # built here rather than by Domain.get_event_attributes, whose unbounded cache would keep one
        # object per payload (every iteration, every request) for the life of the process
        return EventAttributes(self._domain.get_registered_string(name), _COLORS.get(name, "blue"), None, payload)

    def start_step(self, iteration: int) -> StepTimes:
        """Read the clock and open the iteration's push/pop `step` range; its phases nest inside it."""
        times = StepTimes(self._now())
        _push(self._attrs(STEP, iteration), self._handle)
        return times

    def end_step(self) -> None:
        _pop(self._handle)

    def open_step(self, iteration: int) -> tuple[StepTimes, object]:
        """Overlap mode: read the clock and open the iteration's `step` as a start/end range (consecutive
        ones overlap in time, so they cannot nest on one thread); its phases are push/pop ranges on this
        thread, and its forward pass is a `forward` range with the iteration as payload (see device_forward)."""
        times = StepTimes(self._now(), opened=True)
        return times, _start(self._attrs(STEP, iteration), self._handle)

    def close_step(self, step: object) -> None:
        _end(step)

    def device_forward(self, iteration: int, times: StepTimes) -> _DeviceRange:
        """Overlap mode: a `forward` range whose payload is the iteration, timed into `times`, for whichever
        thread runs the device work (a device thread on the CPU, the launching thread on CUDA)."""
        return _DeviceRange(self._attrs(PhaseName.FORWARD.value, iteration), self._handle, times, self._now)

    def phase(self, name: PhaseName, times: StepTimes) -> _Range:
        """`with tracer.phase(PhaseName.FORWARD, times): ...` wraps the block in that phase's range, timed into `times`."""
        rng = self._phases[name]
        rng.starts, rng.ends = times.starts, times.ends
        return rng

    def mark(self, name: str, request_id: int) -> None:
        _mark(self._attrs(name, request_id), self._handle)

    def tokens(self, iteration: int, added, removed) -> None:
        """Mark the change in the set of requests that get a token, from this iteration on."""
        _mark(self._attrs(tokens_text(added, removed), iteration), self._handle)


def nvtx_recorded() -> bool:
    """Whether a tool records this process's NVTX calls: nsys (like any NVTX tool) names its library in
    NVTX_INJECTION64_PATH; without one, every NVTX call does nothing."""
    return bool(os.environ.get("NVTX_INJECTION64_PATH"))


def tokens_text(added, removed) -> str:
    """`tokens +3,4 -1`: requests that start (+) and stop (-) getting a token each iteration.

    The requests that got a token in iteration i are those added and not since removed by the
    `tokens` marks whose payload is at most i; an iteration with no forward pass removes all.
    """
    text = TOKENS
    if len(added):
        text += " +" + ",".join(map(str, added))
    if len(removed):
        text += " -" + ",".join(map(str, removed))
    return text
