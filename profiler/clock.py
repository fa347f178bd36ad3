"""Clocks the engine reads: the wall clock for real runs, a virtual one for simulated runs."""
from __future__ import annotations

import time


class WallClock:
    """Monotonic nanoseconds since the clock was made (time.perf_counter_ns)."""

    source = "time.perf_counter_ns"
    simulated = False

    def __init__(self) -> None:
        self._t0 = time.perf_counter_ns()
        self.epoch_unix_ns = time.time_ns()  # wall time at t = 0, for humans; joins use ids, not clocks
        self._paused_at: int | None = None

    def now_ns(self) -> int:
        return time.perf_counter_ns() - self._t0

    def pause(self) -> None:
        """Stop the clock (while another engine takes its turn: session.run_in_turn)."""
        self._paused_at = time.perf_counter_ns()

    def resume(self) -> None:
        """Start it again where it stopped: the time it was paused never shows in its readings."""
        if self._paused_at is not None:
            self._t0 += time.perf_counter_ns() - self._paused_at
            self._paused_at = None

    def sleep_until(self, t_ns: int) -> None:
        delay = t_ns - self.now_ns()
        if delay > 0:
            time.sleep(delay / 1e9)


class SimClock:
    """Virtual nanoseconds: only the simulated runner's cost model (and idle waits) move it."""

    source = "simulated"
    simulated = True
    epoch_unix_ns = 0

    def __init__(self) -> None:
        self._t = 0

    def now_ns(self) -> int:
        return self._t

    def advance(self, dt_ns: int) -> None:
        self._t += int(dt_ns)

    def pause(self) -> None:  # virtual time does not move while another engine runs anyway
        pass

    def resume(self) -> None:
        pass

    def sleep_until(self, t_ns: int) -> None:
        self._t = max(self._t, int(t_ns))
