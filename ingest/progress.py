"""Progress of a long ingest on stderr: a bar on a terminal, a plain line every few seconds in a log."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_BAR_WIDTH = 24


class Progress:
    """Counts rows written against rows expected and shows it, at most every `interval_s` seconds."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._tty = enabled and self._stream.isatty()
        self._enabled = enabled
        self._interval_s = interval_s if interval_s is not None else (0.2 if self._tty else 10.0)
        self._clock = clock
        self._started = clock()
        self._shown_at = self._started
        self._shown_width = 0
        self.expected = 0
        self.done = 0

    def expect(self, rows: int) -> None:
        """Add `rows` to the rows this ingest will write."""
        self.expected += rows

    def advance(self, rows: int, label: str) -> None:
        """Count `rows` more rows written, from the table named `label`."""
        self.done += rows
        self._show(label)

    def phase(self, label: str) -> None:
        """Say what the ingest is doing when it is not writing rows, e.g. building a table."""
        self._show(label, phase=True)

    def close(self) -> None:
        """Clear the bar, leaving the terminal line empty for the closing message."""
        if self._tty and self._shown_width:
            self._stream.write("\r" + " " * self._shown_width + "\r")
            self._stream.flush()
        self._shown_width = 0

    def _show(self, label: str, *, phase: bool = False) -> None:
        if not self._enabled:
            return
        now = self._clock()
        if phase:  # a new phase shows at once on a terminal; in a log, once the ingest has run a while
            due = self._tty or now - self._started >= self._interval_s
        else:
            due = now - self._shown_at >= self._interval_s
        if not due:
            return
        self._shown_at = now
        text = f"ingest {self._counts()}  {label}"
        if self._tty:
            padding = " " * max(0, self._shown_width - len(text))
            self._stream.write("\r" + text + padding)
            self._shown_width = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def _counts(self) -> str:
        if not self.expected:
            return f"{self.done:,} rows"
        fraction = min(1.0, self.done / self.expected)
        filled = int(fraction * _BAR_WIDTH)
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        return f"{fraction:4.0%} [{bar}] {self.done:,}/{self.expected:,} rows"
