"""Byte-level tokenizer: ids 0..255 are UTF-8 bytes, then a few special tokens."""
from __future__ import annotations

import codecs
import random
import string

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


def synth_prompt(length: int, seed: int) -> list[int]:
    """A deterministic prompt of exactly `length` tokens: lowercase words separated by single spaces."""
    if length < 0:
        raise ValueError(f"prompt length must be >= 0, got {length}")
    rng = random.Random(seed)
    words: list[str] = []
    chars = 0
    while chars < length:
        words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 9))))
        chars += len(words[-1]) + 1
    return encode((" ".join(words) + " ")[:length])
