"""Byte-level tokenizer: ids 0..255 are UTF-8 bytes, then a few special tokens."""
from __future__ import annotations

import codecs
import random
from collections.abc import Sequence

import numpy as np

NUM_BYTES = 256
BOS = 256
EOS = 257
PAD = 258
SPECIAL_IDS = frozenset({BOS, EOS, PAD})


def encode(text: str) -> list[int]:
    """Token ids of `text`: its UTF-8 bytes, no special tokens added."""
    return list(text.encode("utf-8"))


def decode(token_ids: list[int]) -> str:
    """Text of `token_ids`; ids that are not bytes give nothing, invalid UTF-8 gives U+FFFD."""
    return bytes(t for t in token_ids if 0 <= t < NUM_BYTES).decode("utf-8", errors="replace")


class IncrementalDetokenizer:
    """One request's output text, built a token at a time; holds incomplete UTF-8 sequences."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = False  # the decoder holds the start of a multi-byte character

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes ("" while a multi-byte character is unfinished)."""
        if token_id < 128 and not self._pending and token_id >= 0:
            return chr(token_id)  # ASCII between characters: the common case, without the codec
        if not 0 <= token_id < NUM_BYTES:
            return ""
        text = self._decoder.decode(bytes((token_id,)))
        self._pending = bool(self._decoder.getstate()[0])
        return text

    def flush(self) -> str:
        """At the end of a request: U+FFFD for a trailing incomplete sequence, else ""."""
        return self._decoder.decode(b"", final=True)


# Synthetic prompts
# ----------------
# A prompt is lowercase words of 1..9 letters, each followed by one space, cut to the length asked
# for. It was first written as a loop over `random.Random(seed)`: per word `randint(1, 9)`, then
# `choices(ascii_lowercase, k=that)`. Those ids are part of every run log's inputs, so they must not
# change; the code below gives the same ids from the same Mersenne Twister outputs, faster, by
# drawing the words' 32-bit outputs in one call and turning them into letters with numpy. Requests hold a
# `SynthPrompt`, which makes its ids only when they are first read: the simulated runner never reads
# them, so a 100,000-request simulated run makes none.
# tests/profiler/test_tokenizer.py keeps the loop, and holds the two equal.
#
# How `random` consumes 32-bit outputs u[0], u[1], ... (CPython's _randommodule.c and random.py):
# - randint(1, 9) is 1 + _randbelow(9): 4-bit draws u >> 28, redrawn while >= 9: one output each;
# - choices(26 letters) picks floor(random() * 26.0) per letter, and random() takes two outputs:
#   (u[i] >> 5) * 2**26 + (u[i + 1] >> 6), an exact integer m < 2**53, times 2**-53.
# random() * 26.0 is one rounding of m * 26 * 2**-53, so m * (26 / 2**53) (an exact constant) gives
# the same double, and its floor the same letter.

_DRAWS_PER_CHAR = 2  # a letter takes 2 outputs; a word's randint 16/9 in the mean, under the 2 its space gets
_DRAWS_SPARE = 32  # past the mean; when a prompt needs more than this, it is drawn again with twice as many


def _draws(rng: random.Random, n: int) -> bytes:
    """`rng`'s next `n` 32-bit outputs as little-endian uint32 bytes, in the order they are drawn.

    getrandbits fills a big integer from its least significant 32-bit word up, one output per word,
    on every platform; so the little-endian bytes of that integer are the outputs in order.
    """
    return rng.getrandbits(32 * n).to_bytes(4 * n, "little")


def _tables(raw: bytes) -> tuple[bytes, bytes]:
    """For every output u[i]: the 4-bit randint draw u[i] >> 28, and the letter byte random() picks from u[i], u[i+1].

    The letter of the last output (no successor) is a placeholder that the prompts never read.
    """
    u = np.frombuffer(raw, dtype="<u4")
    nibbles = (u >> 28).astype(np.uint8)
    m = (u >> 5).astype(np.float64) * 67108864.0  # 2**26
    m[:-1] += u[1:] >> 6
    letters = (m * (26 / 9007199254740992)).astype(np.uint8)  # floor, as the values are >= 0
    letters += ord("a")
    return nibbles.tobytes(), letters.tobytes()


def _prompt_from_tables(length: int, nibbles: bytes, letters: bytes) -> list[int] | None:
    """The prompt drawn from the tables' outputs; None if it needs more outputs than they hold."""
    out = bytearray()
    p, stop = 0, len(nibbles)
    while len(out) < length:
        while p < stop and nibbles[p] >= 9:  # randint(1, 9) rejects 9..15 and draws again
            p += 1
        if p >= stop:
            return None
        end = p + 1 + 2 * (nibbles[p] + 1)  # the word's letters come from outputs p+1 .. end-1
        if end > stop:
            return None
        out += letters[p + 1 : end : 2]
        out += b" "
        p = end
    del out[length:]
    return list(out)


def synth_prompt(length: int, seed: int) -> list[int]:
    """A deterministic prompt of exactly `length` tokens: lowercase words separated by single spaces."""
    if length < 0:
        raise ValueError(f"prompt length must be >= 0, got {length}")
    if length == 0:
        return []
    n = _DRAWS_PER_CHAR * length + _DRAWS_SPARE
    while True:  # rarely more than once: when the words took more outputs than drawn, draw twice as many
        nibbles, letters = _tables(_draws(random.Random(seed), n))
        prompt = _prompt_from_tables(length, nibbles, letters)
        if prompt is not None:
            return prompt
        n *= 2


class SynthPrompt(Sequence):
    """`synth_prompt(length, seed)` as a sequence of ids, made when first read: its length is known
    without them. A request's prompt; the simulated runner only ever asks for its length."""

    __slots__ = ("seed", "_length", "_ids")

    def __init__(self, length: int, seed: int) -> None:
        if length < 0:
            raise ValueError(f"prompt length must be >= 0, got {length}")
        self._length, self.seed, self._ids = length, seed, None

    @property
    def ids(self) -> list[int]:
        if self._ids is None:
            self._ids = synth_prompt(self._length, self.seed)
        return self._ids

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        return self.ids[index]

    def __iter__(self):
        return iter(self.ids)

    def __eq__(self, other) -> bool:
        if isinstance(other, SynthPrompt):
            other = other.ids
        return self.ids == other if isinstance(other, list) else NotImplemented

    def __repr__(self) -> str:
        return f"SynthPrompt(length={self._length}, seed={self.seed})"
