"""The transformer's conventions, its seeded weights, and checkpoint loading and saving."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from itertrace.errors import UserError
from itertrace.profiler.scheduling.batch import Batch, SamplingParams, SeqWork
from itertrace.profiler.runners.torch.checkpoint import load_checkpoint, save_checkpoint
from itertrace.profiler.runners.torch.model import ModelConfig, apply_rotary, random_model, rotary_cos_sin
from itertrace.profiler.runners.torch.torch_runner import TorchRunner

TINY = ModelConfig(vocab_size=260, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48)


def test_rotary_uses_the_rotate_half_pairing() -> None:
    # head_dim 4: dimension 0 pairs with 2 (frequency 1), dimension 1 with 3 (frequency theta^-1/2)
    cos, sin = rotary_cos_sin(torch.tensor([3]), head_dim=4, theta=100.0, dtype=torch.float32)
    e0 = apply_rotary(torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]), cos, sin)
    e1 = apply_rotary(torch.tensor([[[0.0, 1.0, 0.0, 0.0]]]), cos, sin)
    torch.testing.assert_close(e0[0, 0], torch.tensor([math.cos(3), 0.0, math.sin(3), 0.0]))
    torch.testing.assert_close(e1[0, 0], torch.tensor([0.0, math.cos(0.3), 0.0, math.sin(0.3)]))


def test_random_weights_are_seeded_and_scaled() -> None:
    a, b, c = (random_model(ModelConfig(), seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)
    assert abs(a.layers[0].mlp.up_proj.weight.std().item() - 0.02) < 1e-3
    assert torch.equal(a.norm.weight, torch.ones(256))
    assert a.layers[0].self_attn.k_proj.weight.shape == (256, 256)
    assert sum(p.numel() for p in a.parameters()) == 2 * 260 * 256 + 256 + 4 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256)


def test_config_rejects_impossible_shapes() -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(dtype="float8")
    assert ModelConfig(hidden_size=512, num_heads=8).head_dim == 64


def logits_of(runner: TorchRunner) -> torch.Tensor:
    prompt = tuple(range(40, 70))
    seq = SeqWork(1, prompt, 0, tuple(range(8)), True, SamplingParams(), 0)
    return runner.forward(runner.prepare(Batch.from_seqs(0, (seq,), 4)))


TINY_TIED = ModelConfig(hidden_size=32, num_heads=2, num_kv_heads=2, num_layers=1, intermediate_size=40,
                        tie_word_embeddings=True, rope_theta=500.0)


@pytest.mark.parametrize("config", [TINY, TINY_TIED], ids=["gqa", "tied"])
def test_checkpoint_round_trip_gives_identical_logits(tmp_path: Path, config: ModelConfig) -> None:
    original = TorchRunner(config, num_blocks=8, block_size=4, seed=9)
    save_checkpoint(original.model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["num_key_value_heads"] == config.num_kv_heads and raw["rope_theta"] == config.rope_theta
    names = set(load_file(tmp_path / "model.safetensors"))
    assert "model.layers.1.self_attn.q_proj.weight" in names or config.num_layers == 1
    assert ("lm_head.weight" in names) != config.tie_word_embeddings
    loaded = TorchRunner(checkpoint=tmp_path, num_blocks=8, block_size=4, seed=123)
    assert loaded.config == config
    assert torch.equal(logits_of(loaded), logits_of(original))


def test_weights_may_be_split_over_several_files(tmp_path: Path) -> None:
    save_checkpoint(random_model(TINY, seed=4), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[::2]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[1::2]}, tmp_path / "model-00002-of-00002.safetensors")
    loaded = load_checkpoint(tmp_path)
    assert torch.equal(loaded.layers[1].mlp.down_proj.weight, tensors["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(loaded.lm_head.weight, tensors["lm_head.weight"])


def broken_checkpoint(tmp_path: Path, fault: str) -> Path:
    """A tiny checkpoint with one thing wrong; returns the file that the error should name."""
    save_checkpoint(random_model(TINY, seed=1), tmp_path)
    config_path, weights_path = tmp_path / "config.json", tmp_path / "model.safetensors"
    raw = json.loads(config_path.read_text())
    tensors = load_file(weights_path)
    if fault == "missing key":
        del raw["hidden_size"]
    elif fault == "bad value":
        raw["num_hidden_layers"] = "two"
    elif fault == "not json":
        config_path.write_text("{ nope")
        return config_path
    elif fault == "rope scaling":
        raw["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    elif fault == "missing tensor":
        del tensors["model.layers.1.mlp.up_proj.weight"]
    elif fault == "misshaped tensor":
        tensors["model.norm.weight"] = torch.ones(33)
    elif fault == "corrupt weights":
        weights_path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
        return weights_path
    config_path.write_text(json.dumps(raw))
    save_file(tensors, weights_path)
    return config_path if fault in ("missing key", "bad value", "rope scaling") else weights_path


@pytest.mark.parametrize("fault, words", [
    ("missing key", "hidden_size"), ("bad value", "num_hidden_layers"), ("not json", "JSON"),
    ("rope scaling", "rope_scaling"), ("missing tensor", "model.layers.1.mlp.up_proj.weight"),
    ("misshaped tensor", "model.norm.weight"), ("corrupt weights", "safetensors"),
])
def test_bad_checkpoint_raises_one_line_naming_the_file(tmp_path: Path, fault: str, words: str) -> None:
    culprit = broken_checkpoint(tmp_path, fault)
    with pytest.raises(UserError) as info:
        load_checkpoint(tmp_path)
    message = str(info.value)
    assert culprit.name in message and words in message and "\n" not in message


def test_missing_directory_and_missing_config_raise_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(UserError, match="config.json"):
        load_checkpoint(tmp_path)
    save_checkpoint(random_model(TINY), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no \\*.safetensors"):
        load_checkpoint(tmp_path)


def test_absent_optional_keys_take_hf_llama_defaults(tmp_path: Path) -> None:
    save_checkpoint(random_model(replace(TINY_TIED, tie_word_embeddings=False, rope_theta=1e6)), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("num_key_value_heads", "rope_theta", "tie_word_embeddings", "torch_dtype"):
        del raw[key]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model = load_checkpoint(tmp_path, dtype="bfloat16")
    assert model.config.num_kv_heads == 2 and model.config.rope_theta == 10000.0
    assert not model.config.tie_word_embeddings and model.lm_head.weight.dtype == torch.bfloat16


def test_transformers_5_rope_parameters_are_read(tmp_path: Path) -> None:
    save_checkpoint(random_model(TINY), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["rope_theta"], raw["torch_dtype"]
    raw.update(rope_parameters={"rope_theta": 5000.0, "rope_type": "default"}, dtype="bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_checkpoint(tmp_path).config == replace(TINY, rope_theta=5000.0, dtype="bfloat16")
    raw["rope_parameters"]["rope_type"] = "yarn"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="config.json: rope_parameters=.*yarn"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("summed", ["index_add", "tree"])  # tree: how CUDA sums, here on the CPU
@pytest.mark.parametrize("chunk_keys", [4, 1024])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2)])
def test_decode_attention_reads_each_context_exactly(monkeypatch, chunk_keys, heads, kv_heads, summed) -> None:
    """Varlen decode attention (chunked or not) equals dense softmax attention over each decode's own keys."""
    from itertrace.profiler.runners.torch import model as model_mod
    from itertrace.profiler.runners.torch.model import Attention, AttentionMetadata

    monkeypatch.setattr(model_mod, "DECODE_CHUNK_KEYS", chunk_keys)
    if summed == "tree":
        monkeypatch.setattr(model_mod, "segment_sum", lambda x, seq, meta: model_mod.tree_segment_sum(x, meta))
    config = ModelConfig(hidden_size=64, num_heads=heads, num_kv_heads=kv_heads, intermediate_size=96)
    attn, hd, bs = Attention(config), config.head_dim, 4
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(40, bs, kv_heads, hd, generator=gen) for _ in range(2))
    lens = torch.tensor([1, 9, 4, 23])  # a lone key, partial last blocks, a whole block, a long context
    width = -(-int(lens.max()) // bs)
    tables = torch.randperm(40, generator=gen)[:len(lens) * width].view(len(lens), width)
    meta = AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.long), block_size=bs, prefill_query_ranges=[],
                             prefill_block_tables=[], prefill_context_lens=[], prefill_masks=[],
                             decode_rows=torch.arange(len(lens)), decode_block_tables=tables, decode_context_lens=lens)
    q = torch.randn(len(lens), heads, hd, generator=gen)
    got = attn._attend_decodes(q, k_cache, v_cache, meta)
    for i, n in enumerate(lens.tolist()):
        keys = k_cache[tables[i]].flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, dim=1)  # [n, heads, hd]
        values = v_cache[tables[i]].flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, dim=1)
        weights = torch.einsum("hd,nhd->hn", q[i], keys).div(math.sqrt(hd)).softmax(-1)
        torch.testing.assert_close(got[i], torch.einsum("hn,nhd->hd", weights, values), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lens", [[1, 9, 4, 23], [0, 5, 0], [4096] + [1] * 255, [33, 17, 64, 1, 2, 3, 100]])
def test_tree_segment_sum_equals_index_add(lens) -> None:
    """The fixed-order sum CUDA uses adds each decode's blocks exactly as index_add_ does (up to rounding),
    for ragged decodes, decodes holding no block, and one long context among many short ones."""
    from itertrace.profiler.runners.torch.model import AttentionMetadata, segment_sum, tree_segment_sum

    bs = 16
    lens_t = torch.tensor(lens)
    width = max(1, -(-max(lens) // bs))
    tables = torch.arange(len(lens) * width).view(len(lens), width)
    meta = AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.long), block_size=bs, prefill_query_ranges=[],
                             prefill_block_tables=[], prefill_context_lens=[], prefill_masks=[],
                             decode_rows=torch.arange(len(lens)), decode_block_tables=tables, decode_context_lens=lens_t)
    _, seq, _ = meta.decode_keys
    x = torch.randn(len(seq), 2, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = segment_sum(x, seq, meta)  # index_add_ on the CPU
    got = tree_segment_sum(x, meta)
    assert got.shape == (len(lens), 2, 3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[lens_t == 0], torch.zeros_like(got[lens_t == 0]))
