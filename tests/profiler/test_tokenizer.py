"""Byte-level tokenizer, incremental detokenizer and synthetic prompts."""
from __future__ import annotations

import random
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from itertrace.profiler.workloads import tokenizer
from itertrace.profiler.workloads.tokenizer import (BOS, EOS, PAD, IncrementalDetokenizer, SynthPrompt, decode,
                                          encode, synth_prompt)

TEXT = "naïve 東京 🎉"


def test_round_trip_of_multibyte_text() -> None:
    ids = encode(TEXT)
    assert len(ids) == len(TEXT.encode("utf-8")) == 18  # ï 2 bytes, each kanji 3, the emoji 4
    assert all(0 <= t < 256 for t in ids)
    assert decode(ids) == TEXT
    assert decode([BOS, *ids, EOS, PAD]) == TEXT
    assert (BOS, EOS, PAD) == (256, 257, 258)


def test_incremental_detokenizer_holds_partial_characters() -> None:
    detok = IncrementalDetokenizer()
    pieces = [detok.push(t) for t in encode("a🎉b")]
    assert pieces == ["a", "", "", "", "🎉", "b"]
    detok = IncrementalDetokenizer()
    pieces = [detok.push(t) for t in [BOS, *encode(TEXT), EOS]]
    assert "".join(pieces) == TEXT
    assert pieces[0] == pieces[-1] == ""
    assert pieces[8:11] == ["", "", "東"]  # "naïve " is 7 bytes, after BOS


def test_invalid_utf8_gives_replacement_characters_and_never_raises() -> None:
    ids = [0x61, 0xFF, 0xE6, 0x9D, 0x62, 0xE6]  # a, a bad byte, a truncated kanji, b, a dangling lead byte
    detok = IncrementalDetokenizer()
    text = "".join(detok.push(t) for t in ids) + detok.flush()
    assert text == decode(ids) == "a\ufffd\ufffdb\ufffd"


@given(st.lists(st.integers(min_value=0, max_value=259), max_size=60))
def test_incremental_output_always_equals_decode(ids: list[int]) -> None:
    detok = IncrementalDetokenizer()
    assert "".join(detok.push(t) for t in ids) + detok.flush() == decode(ids)


def test_synth_prompt_has_exact_length_and_is_deterministic() -> None:
    for length in (0, 1, 2, 7, 128, 1000):
        ids = synth_prompt(length, seed=5)
        assert len(ids) == length
        assert ids == synth_prompt(length, seed=5)
        assert all(t == 0x20 or 0x61 <= t <= 0x7A for t in ids)
    assert synth_prompt(200, seed=5) != synth_prompt(200, seed=6)
    assert synth_prompt(200, seed=5)[:50] == synth_prompt(50, seed=5)
    words = decode(synth_prompt(500, seed=1)).split(" ")
    assert len(words) > 40 and all(words[:-1])  # words separated by single spaces


def test_synth_prompt_keeps_its_known_ids() -> None:
    # Written out from the original loop over `random` (`_synth_prompt_reference` below): every run log's
    # prompts come from here, so a change to either implementation must fail this test.
    assert decode(synth_prompt(72, seed=0)) == "tkgnkuh jxfddcuz zvxisxrmc iqfolnb xcvsuqpvi sbxfud lcinycoso fuohcuige "
    assert decode(synth_prompt(40, seed=1_000_003 * 3 + 17)) == "itqmgn pvp gtisuc co yjgusvweg kogdhpuae"
    assert synth_prompt(1, seed=5) == [116]
    assert synth_prompt(9, seed=2**40) == [106, 98, 32, 107, 32, 99, 114, 114, 105]
    assert synth_prompt(0, seed=3) == []


def _synth_prompt_reference(length: int, seed: int) -> list[int]:
    """The original loop over `random`: the definition `synth_prompt` must match."""
    rng = random.Random(seed)
    words: list[str] = []
    chars = 0
    while chars < length:
        words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 9))))
        chars += len(words[-1]) + 1
    return encode((" ".join(words) + " ")[:length])


def test_synth_prompt_equals_the_reference_loop(monkeypatch) -> None:
    lengths = [*range(0, 140), 1000, 5000, 20_000]
    seeds = [s * 7919 - 300 for s in range(len(lengths))]  # negative ones too: random uses abs(seed)
    want = [_synth_prompt_reference(n, s) for n, s in zip(lengths, seeds)]
    assert [synth_prompt(n, s) for n, s in zip(lengths, seeds)] == want
    assert synth_prompt(200, 2**70 + 1) == _synth_prompt_reference(200, 2**70 + 1)  # a multi-word seed
    # Too few outputs drawn up front: every prompt takes the redraw path.
    monkeypatch.setattr(tokenizer, "_DRAWS_PER_CHAR", 1)
    monkeypatch.setattr(tokenizer, "_DRAWS_SPARE", 0)
    assert [synth_prompt(n, s) for n, s in zip(lengths, seeds)] == want


def test_a_synth_prompt_reads_as_its_ids_and_makes_them_only_when_read() -> None:
    prompt = SynthPrompt(300, seed=11)
    assert len(prompt) == 300 and prompt._ids is None  # its length costs nothing
    want = synth_prompt(300, seed=11)
    assert prompt[5] == want[5] and prompt[250:] == want[250:] and list(prompt) == want
    assert prompt == want and prompt == SynthPrompt(300, seed=11) and prompt != SynthPrompt(300, seed=12)


def test_synth_prompt_and_synth_prompt_objects_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="length must be >= 0"):
        synth_prompt(-1, seed=0)
    with pytest.raises(ValueError, match="length must be >= 0"):
        SynthPrompt(-1, seed=0)
