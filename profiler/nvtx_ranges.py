"""NVTX names are an API: the queries find the engine's phases by these exact strings.

Every iteration is a `step` push/pop range in domain `itertrace` whose int64 payload is the
iteration number; inside it, one range per phase. Request arrival and finish are marks whose
payload is the request id.
"""
from __future__ import annotations

import enum
from nvtx._lib import mark as _mark
from nvtx._lib import pop_range as _pop
from nvtx._lib import push_range as _push
import nvtx

DOMAIN = "itertrace"
STEP = "step"  # one per iteration; payload = iteration number
ARRIVE = "arrive"  # mark; payload = request id
FINISH = "finish"  # mark; payload = request id (finished, canceled or rejected)


class PhaseName(enum.Enum):
    """The host phases of one iteration, in the order they run."""

    SCHEDULE = "schedule"
    PREPARE = "prepare"  # block tables, positions, slot mapping (and KV swaps)
    FORWARD = "forward"
    SAMPLE = "sample"
    DETOKENIZE = "detokenize"
    POSTPROCESS = "postprocess"


PHASES: tuple[str, ...] = tuple(p.value for p in PhaseName)

_COLORS = {STEP: "green", "schedule": "blue", "prepare": "cyan", "forward": "red", "sample": "orange",
           "detokenize": "purple", "postprocess": "yellow", ARRIVE: "darkgreen", FINISH: "white"}


class _Range:
    """A reusable push/pop context manager for one fixed range (cheaper than contextlib's)."""

    __slots__ = ("_attrs", "_handle")

    def __init__(self, attrs, handle) -> None:
        self._attrs, self._handle = attrs, handle

    def __enter__(self) -> None:
        _push(self._attrs, self._handle)

    def __exit__(self, *exc) -> None:
        _pop(self._handle)


class Tracer:
    """Emits this engine's NVTX ranges and marks; phase attributes are built once."""

    def __init__(self) -> None:
        self._domain = nvtx.get_domain(DOMAIN)
        self._handle = self._domain.handle
        self._phases = {p: _Range(self._attrs(p.value), self._handle) for p in PhaseName}

    def _attrs(self, name: str, payload: int | None = None):
        return self._domain.get_event_attributes(name, _COLORS.get(name, "blue"), None, payload)

    def push_step(self, iteration: int) -> None:
        _push(self._attrs(STEP, iteration), self._handle)

    def pop(self) -> None:
        _pop(self._handle)

    def phase(self, name: PhaseName) -> _Range:
        """`with tracer.phase(PhaseName.FORWARD): ...` wraps the block in that phase's range."""
        return self._phases[name]

    def mark(self, name: str, request_id: int) -> None:
        _mark(self._attrs(name, request_id), self._handle)
