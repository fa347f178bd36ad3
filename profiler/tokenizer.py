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
# change; the code below gives the same ids from the same Mersenne Twister outputs, about three times
# faster, by drawing the words' 32-bit outputs in one call and turning them into letters with
# numpy (seeding a generator per prompt is now the larger part of the cost).
# tests/test_tokenizer.py keeps the loop, and holds the two equal.
#
# How `random` consumes 32-bit outputs u[0], u[1], ... (CPython's _randommodule.c and random.py):
# - randint(1, 9) is 1 + _randbelow(9): 4-bit draws u >> 28, redrawn while >= 9: one output each;
# - choices(26 letters) picks floor(random() * 26.0) per letter, and random() takes two outputs:
#   (u[i] >> 5) * 2**26 + (u[i + 1] >> 6), an exact integer m < 2**53, times 2**-53.
# random() * 26.0 is one rounding of m * 26 * 2**-53, so m * (26 / 2**53) (an exact constant) gives
# the same double, and its floor the same letter.

_DRAWS_PER_CHAR = 2  # a letter takes 2 outputs; a word's randint 16/9 in the mean, under the 2 its space gets
_DRAWS_SPARE = 32  # past the mean; when a prompt needs more than this, it is drawn again with twice as many
_BATCH_DRAWS = 1 << 16  # outputs per numpy pass in synth_prompts: in cache, _tables runs 4x faster than at 1 << 20


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


def _prompt_from_tables(length: int, nibbles: bytes, letters: bytes, start: int, stop: int) -> list[int] | None:
    """The prompt drawn from outputs [start, stop) of the tables; None if it needs outputs past `stop`."""
    out = bytearray()
    p = start
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
    return synth_prompts([length], [seed])[0]


def synth_prompts(lengths: Sequence[int], seeds: Sequence[int]) -> list[list[int]]:
    """`synth_prompt(length, seed)` for each pair, with the numpy work shared by many prompts at a time."""
    if len(lengths) != len(seeds):
        raise ValueError(f"{len(lengths)} lengths but {len(seeds)} seeds")
    for length in lengths:
        if length < 0:
            raise ValueError(f"prompt length must be >= 0, got {length}")
    prompts: list[list[int]] = []
    i = 0
    while i < len(lengths):  # one numpy pass per batch of prompts of up to _BATCH_DRAWS outputs in all
        chunks, stops, total = [], [], 0
        while i + len(chunks) < len(lengths) and (not chunks or total < _BATCH_DRAWS):
            length, seed = lengths[i + len(chunks)], seeds[i + len(chunks)]
            n = _DRAWS_PER_CHAR * length + _DRAWS_SPARE if length else 0
            chunks.append(_draws(random.Random(seed), n))
            total += n
            stops.append(total)
        nibbles, letters = _tables(b"".join(chunks))
        start = 0
        for j, stop in enumerate(stops):
            prompt = _prompt_from_tables(lengths[i + j], nibbles, letters, start, stop)
            if prompt is None:  # rare: the prompt's words took more outputs than drawn; draw more
                prompt = _synth_prompt_long(lengths[i + j], seeds[i + j], 2 * (stop - start))
            prompts.append(prompt)
            start = stop
        i += len(chunks)
    return prompts


def _synth_prompt_long(length: int, seed: int, n: int) -> list[int]:
    """One prompt from `n` outputs of its generator, doubling `n` until they suffice."""
    while True:
        nibbles, letters = _tables(_draws(random.Random(seed), n))
        prompt = _prompt_from_tables(length, nibbles, letters, 0, n)
        if prompt is not None:
            return prompt
        n *= 2

