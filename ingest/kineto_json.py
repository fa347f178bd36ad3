"""Split a Chrome-trace JSON file (as torch.profiler writes it) into its event array and its other keys.

DuckDB reads a top-level JSON array element by element, streaming, but a top-level object whole (a
300 MB trace took 2.8 GB that way). So the file, gzipped or not, is read once in chunks and its
`traceEvents` array is copied as it is into a file of its own, for `read_json(format='array')`; the
other top-level keys (deviceProperties, distributedInfo, baseTimeNanoseconds, ...) are small and are
parsed here. A bare top-level array (Chrome's "JSON Array Format") is all events.

Notes
-----
The array's end is found by following the JSON structure through the whole file: quotes toggle
strings (an escaped character is blanked first, keeping offsets), and brackets outside strings
change the depth. Chunks inside the array need only their lowest depth, taken on the quotes and
brackets alone (`bytes.translate` keeps those); the chunk where the depth falls back out of the
array is read again by position. Memory is one chunk, whatever the file's size.

White space outside strings is cut short, so that valid JSON is valid at any padding: in the text
around the array (kept to be parsed here, up to MAX_META_BYTES) each run becomes one byte; inside the
array a run at either end of a chunk (or of the block where the array closes) does, which leaves runs
shorter than a chunk, well within what DuckDB's JSON reader takes (a run of 33 MB before the array's
closing bracket failed there, one of 31 MB did not). Which of a chunk's blanks lie outside strings
follows from the string state at its ends, which the scan has anyway: the array's chunks are not
searched for runs, whose cost the copy would pay on every trace.

Why this is not a JSON library's streaming parser: docs/libraries.md.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from itertrace.errors import UserError

CHUNK_BYTES = 8 << 20
FIRST_CHUNK_BYTES = 64 << 10  # the head is read in a small chunk: the array usually opens within kilobytes
BLOCK_BYTES = 256 << 10  # where the array closes is looked for block by block, then by position
MAX_META_BYTES = 64 << 20  # the top-level keys besides traceEvents are metadata: kilobytes in practice
GZIP_MAGIC = b"\x1f\x8b"
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash and the character it escapes
_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_KEY_PREFIX = re.compile(rb',?\s*"traceEvents"\s*:\s*$')
_TOKENS_ONLY = bytes(c for c in range(256) if c not in b'"[]{}')  # what translate deletes
_QUOTE = 0x22
_BLANK = b"\xef\xbb\xbf \t\r\n"  # white space, and a UTF-8 byte-order mark
_WHITE = b" \t\r\n"  # JSON's white space
_IS_WHITE = np.zeros(256, dtype=bool)
_IS_WHITE[list(_WHITE)] = True


@dataclass(frozen=True)
class SplitTrace:
    """A trace file taken apart: its other top-level keys, and how many bytes of events were copied."""

    meta: dict[str, Any]
    event_bytes: int


def split_trace(path: Path, events_out: Path) -> SplitTrace:
    """Copy `path`'s event array to `events_out` as a JSON array; return the other top-level keys."""
    try:
        with _open(path) as source, open(events_out, "wb") as sink:
            return _Splitter(path, sink).run(_chunks(source))
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise UserError(f"{path}: truncated or corrupt gzip data ({exc})") from None


def looks_like_trace(path: Path) -> str | None:
    """Why `path` cannot be a Chrome-trace JSON file, judged from its first bytes; None if it may be one."""
    try:
        with _open(path) as source:
            start = text = source.read(4096)
            while text and not text.lstrip(_BLANK):  # past any amount of leading white space
                text = source.read(FIRST_CHUNK_BYTES)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        return f"truncated or corrupt gzip data ({exc})"
    text = text.lstrip(_BLANK)
    if not text:
        return "empty file" if not start else "holds only white space"
    if text[:1] not in (b"{", b"["):
        return f"not a JSON object or array (starts with {text[:12]!r}): not a trace"
    return None


def _open(path: Path) -> BinaryIO:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")


def _chunks(source: BinaryIO) -> Iterator[bytes]:
    """The file in chunks, none ending in a backslash (its escaped character is in the next chunk)."""
    carry = b""
    size = FIRST_CHUNK_BYTES
    while block := source.read(size):
        size = CHUNK_BYTES
        data = carry + block
        cut = len(data.rstrip(b"\\"))
        data, carry = data[:cut], data[cut:]
        if data:
            yield data
    if carry:
        yield carry


class _Splitter:
    """Walks the chunks through three stages: the head (before the array), the array, the tail."""

    def __init__(self, path: Path, sink: BinaryIO) -> None:
        self.path, self.sink = path, sink
        self.in_string, self.depth = False, 0
        self.array_depth: int | None = None  # depth inside the event array, once it has opened
        self.head, self.tail = bytearray(), bytearray()
        self.tail_in_string = False  # the string state at the end of the tail kept so far
        self.written = 0
        self.closed = False

    def run(self, chunks: Iterator[bytes]) -> SplitTrace:
        for data in chunks:
            if self.closed:
                self._keep_tail(data)
            elif self.array_depth is not None:
                self._scan_array(data)
            elif self.head.strip(_BLANK) or data.strip(_BLANK):
                self._scan_head(data)
        if self.array_depth is None:
            self._no_array()
        if not self.closed:
            raise UserError(f"{self.path}: truncated: the file ends inside the traceEvents array")
        self.sink.write(b"]")
        return SplitTrace(self._meta(), self.written + 2)

    def _scan_head(self, data: bytes) -> None:
        data, _ = _squeeze(data, self.in_string)
        if not self.head.strip(_BLANK):  # the document's first chunk with text in it
            first = data.lstrip(_BLANK)[:1]
            if first == b"[":  # a bare array: every element is an event
                at = len(data) - len(data.lstrip(_BLANK))
                self._open_array(data, at, 1)
                return
            if first != b"{":
                raise UserError(f"{self.path}: not a JSON object or array (starts with {data.lstrip(_BLANK)[:12]!r})")
        positions, deltas = self._structure(data)
        depths = self.depth + np.cumsum(deltas, dtype=np.int64)
        opens = np.frombuffer(data, dtype=np.uint8)[positions] == ord("[")
        for i in np.flatnonzero(opens & (depths == 2)).tolist():
            at = int(positions[i])
            before = (bytes(self.head[-64:]) + data[:at])[-64:]
            if _KEY.search(before):
                self._open_array(data, at, 2)
                return
        self.depth = int(depths[-1]) if depths.size else self.depth
        self._keep(self.head, data, "before")
        if self.depth == 0:
            self._no_array()  # the whole document has closed without one

    def _open_array(self, data: bytes, at: int, depth: int) -> None:
        """The event array opens at `data[at]`: keep what came before, copy from there on."""
        self._keep(self.head, data[:at], "before")
        self.array_depth = self.depth = depth
        self.in_string = False  # a bracket outside strings
        self.sink.write(b"[")
        self._scan_array(data[at + 1:])

    def _scan_array(self, data: bytes) -> None:
        lowest, final, in_string = self._depth_range(data)
        if lowest >= self.array_depth:
            self._copy(data, final, in_string)
            return
        for start in range(0, len(data), BLOCK_BYTES):  # the array closes in this chunk: find the block
            block = data[start:start + BLOCK_BYTES]
            lowest, final, in_string = self._depth_range(block)
            if lowest >= self.array_depth:
                self._copy(block, final, in_string)
                continue
            outside_before = not self.in_string
            positions, deltas = self._structure(block)
            depths = self.depth + np.cumsum(deltas, dtype=np.int64)
            end = int(positions[np.flatnonzero(depths < self.array_depth)[0]])
            last = _trim_ends(block[:end], outside_before, True)  # the array's closing bracket is outside strings
            self.sink.write(last)
            self.written += len(last)
            self.closed = True
            self._keep_tail(data[start + end + 1:])
            return

    def _copy(self, data: bytes, depth: int, in_string: bool) -> None:
        """Copy `data`, all inside the array, and take the state after it."""
        data = _trim_ends(data, not self.in_string, not in_string)
        self.depth, self.in_string = depth, in_string
        self.sink.write(data)
        self.written += len(data)

    def _structure(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Offsets of the brackets outside strings in `data`, and +1 / -1 for each; updates the string state."""
        plain = _ESCAPE.sub(b"__", data) if b"\\" in data else data
        b = np.frombuffer(plain, dtype=np.uint8)
        quotes = np.flatnonzero(b == _QUOTE)
        folded = b | 0x20  # '[' -> '{', ']' -> '}'
        brackets = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
        brackets = brackets[(np.searchsorted(quotes, brackets) + self.in_string) % 2 == 0]
        self.in_string = bool((quotes.size + self.in_string) % 2)
        deltas = np.where(b[brackets] & 0x02, 1, -1).astype(np.int8)  # '[' and '{' have bit 1 set, ']' '}' not
        return brackets, deltas

    def _depth_range(self, data: bytes) -> tuple[int, int, bool]:
        """The lowest and the final depth over `data`, and the string state after it; changes no state."""
        plain = _ESCAPE.sub(b"__", data) if b"\\" in data else data
        tokens = np.frombuffer(plain.translate(None, _TOKENS_ONLY), dtype=np.uint8)
        if not tokens.size:
            return self.depth, self.depth, self.in_string
        is_quote = tokens == _QUOTE
        quotes_so_far = np.cumsum(is_quote, dtype=np.uint8)  # mod 256: only its parity is read
        brackets = np.flatnonzero(~is_quote)
        outside = ((quotes_so_far[brackets] + self.in_string) & 1) == 0
        deltas = np.where(tokens[brackets[outside]] & 0x02, 1, -1).astype(np.int8)
        in_string = bool((int(quotes_so_far[-1]) + self.in_string) & 1)
        if not deltas.size:
            return self.depth, self.depth, in_string
        depths = np.cumsum(deltas, dtype=np.int64)
        return self.depth + int(depths.min()), self.depth + int(depths[-1]), in_string

    def _keep_tail(self, data: bytes) -> None:
        data, self.tail_in_string = _squeeze(data, self.tail_in_string)
        self._keep(self.tail, data, "after")

    def _keep(self, buffer: bytearray, data: bytes, where: str) -> None:
        buffer += data
        if len(buffer) > MAX_META_BYTES:
            raise UserError(f"{self.path}: over {MAX_META_BYTES >> 20} MB of top-level keys {where} the traceEvents "
                            "array (or no such array): not a trace as torch.profiler writes it")

    def _no_array(self) -> None:
        if not self.head.strip(_BLANK):
            raise UserError(f"{self.path}: empty file, not a trace")
        try:
            document = json.loads(bytes(self.head))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{self.path}: not valid JSON ({_why(exc)})") from None
        if isinstance(document, dict):
            keys = ", ".join(list(document)[:5]) or "none"
            raise UserError(f"{self.path}: no traceEvents array (top-level keys: {keys}): not a Chrome or Kineto trace")
        raise UserError(f"{self.path}: a JSON {type(document).__name__}, not a Chrome or Kineto trace")

    def _meta(self) -> dict[str, Any]:
        """The top-level keys other than traceEvents, parsed from the text before and after the array."""
        if self.array_depth == 1:  # a bare array: nothing may follow it
            if self.tail.strip(_BLANK):
                raise UserError(f"{self.path}: not valid JSON (text after the top-level array)")
            return {}
        head = _KEY_PREFIX.sub(b"", bytes(self.head)).rstrip()  # '{"a": 1' or '{'
        tail = bytes(self.tail).lstrip()  # ', "b": 2}' or '}'
        if head.endswith(b"{") and tail.startswith(b","):
            tail = tail[1:]
        try:
            meta = json.loads(head + tail)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{self.path}: not valid JSON around the traceEvents array ({_why(exc)})") from None
        if "traceEvents" in meta:
            raise UserError(f"{self.path}: two traceEvents arrays")
        return meta



def _squeeze(data: bytes, in_string: bool) -> tuple[bytes, bool]:
    """`data` with each run of white space outside strings cut to one byte, and the string state after it
    (`in_string`: the state before it)."""
    if not data:
        return data, in_string
    plain = _ESCAPE.sub(b"__", data) if b"\\" in data else data
    b = np.frombuffer(plain, dtype=np.uint8)
    quotes = np.cumsum(b == _QUOTE, dtype=np.uint8)  # mod 256: only its parity is read
    outside = ((quotes + in_string) & 1) == 0  # a closing quote counts as outside, an opening one as inside
    blank = _IS_WHITE[b] & outside
    if not blank.any():
        return data, bool((int(quotes[-1]) + in_string) & 1)
    keep = ~blank
    keep[1:] |= ~blank[:-1]  # the first byte of each run
    return np.frombuffer(data, dtype=np.uint8)[keep].tobytes(), bool((int(quotes[-1]) + in_string) & 1)


def _trim_ends(data: bytes, outside_before: bool, outside_after: bool) -> bytes:
    """`data` with a run of white space at its start (where that lies outside strings) and at its end (likewise)
    cut to one byte."""
    if outside_before and data[1:2] and data[0] in _WHITE and data[1] in _WHITE:
        data = data[len(data) - len(data.lstrip(_WHITE)) - 1:] if data.lstrip(_WHITE) else data[-1:]
    if outside_after and data[-2:-1] and data[-1] in _WHITE and data[-2] in _WHITE:
        data = data[:len(data.rstrip(_WHITE)) + 1]
    return data


def _why(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at byte {exc.pos} of the text around the event array"
    return "not UTF-8 text"
