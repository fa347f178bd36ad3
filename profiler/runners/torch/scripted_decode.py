"""An all-decode forward pass on the CPU compiled with TorchScript, so that it runs without the GIL.

Why: in overlap mode the CPU forward pass runs on a device thread beside the host thread. Eagerly it is
mostly Python between small ops, and each op hands the GIL back and forth with the host, so the two
threads take turns instead of running at once. A TorchScript call releases the GIL for all of its ops
(its interpreter is C++), so the host schedules and prepares the next iteration on the other core
meanwhile, and the per-op overhead falls too, with or without overlap.

The ops are those of `model.py`'s decode path (`Transformer.forward` with only decodes, and
`Attention._attend_decodes` with the CPU's `segment_sum`), one for one and in the same order; the
graph runs unoptimized (no fusion), so it computes what the eager ops compute. Prefill chunks and
CUDA stay eager: a CUDA launch returns at once anyway.
"""
from __future__ import annotations

import warnings
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from itertrace.profiler.runners.torch.model import DECODE_CHUNK_KEYS, AttentionMetadata, Transformer


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _gather(cache: Tensor, block_ids: Tensor) -> Tensor:
    rows = torch.index_select(cache.view(cache.shape[0], -1), 0, block_ids.reshape(-1))
    return rows.view([block_ids.shape[0], cache.shape[1], cache.shape[2], cache.shape[3]])


def _attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, blocks: Tensor, seq: Tensor, past: Tensor,
            num_kv_heads: int, block_size: int, step: int) -> Tensor:
    """Attention._attend_decodes on the CPU: q [D, heads, hd] against each decode's own blocks, `step` at a time."""
    d, heads, hd = q.shape[0], q.shape[1], q.shape[2]
    kv, group = num_kv_heads, heads // num_kv_heads
    n, bs = blocks.shape[0], block_size
    queries = torch.index_select(q.view(d, kv, group, hd), 0, seq)[:, None]  # [B, 1, kv, group, hd]
    scores = torch.empty((n, bs, kv, group), dtype=q.dtype)
    for c in range(0, n, step):
        keys = _gather(k_cache, blocks[c:c + step])[:, :, :, None, :]
        torch.sum(keys * queries[c:c + step], -1, out=scores[c:c + step])
    scores.mul_(hd ** -0.5).masked_fill_(past[:, :, None, None], float("-inf"))
    index = seq[:, None, None].expand(n, kv, group)
    peak = torch.full((d, kv, group), float("-inf"), dtype=q.dtype)
    peak = peak.scatter_reduce(0, index, scores.amax(1), "amax")
    weights = (scores - peak.index_select(0, seq)[:, None]).exp()[..., None]  # [B, bs, kv, group, 1]
    summed = weights.sum([1, 4])
    total = torch.zeros([d, kv, group], dtype=summed.dtype).index_add_(0, seq, summed)
    part = torch.empty((n, kv, group, hd), dtype=q.dtype)
    for c in range(0, n, step):
        values = _gather(v_cache, blocks[c:c + step])[:, :, :, None, :]
        torch.sum(weights[c:c + step] * values, 1, out=part[c:c + step])
    out = torch.zeros([d, kv, group, hd], dtype=part.dtype).index_add_(0, seq, part)
    return (out / total[..., None]).view(d, heads, hd)


def _decode_keys(tables: Tensor, lens: Tensor, block_size: int) -> Tuple[Tensor, Tensor, Tensor]:
    """AttentionMetadata.decode_keys: the decodes' blocks as one flat list, the decode of each, and the keys
    past each decode's context."""
    held = torch.div(lens + block_size - 1, block_size, rounding_mode="floor")  # [D]
    at = (torch.arange(tables.shape[1])[None, :] < held[:, None]).nonzero()  # [B, 2]: (decode, place)
    seq, j = at[:, 0], at[:, 1]
    past = (j * block_size)[:, None] + torch.arange(block_size)[None, :] >= lens[seq][:, None]  # [B, bs]
    return tables[seq, j], seq, past


def _decode_logits(input_ids: Tensor, positions: Tensor, slot_mapping: Tensor, decode_rows: Tensor,
                   tables: Tensor, lens: Tensor, sample_rows: Tensor, inv_freq: Tensor,
                   embed: Tensor, layers: List[List[Tensor]], norm: Tensor, head: Tensor,
                   k_caches: List[Tensor], v_caches: List[Tensor], num_heads: int, num_kv_heads: int,
                   eps: float, block_size: int, chunk_blocks: int) -> Tensor:
    """Transformer.forward and compute_logits for a batch of decodes: logits [S, vocab]."""
    blocks, seq, past = _decode_keys(tables, lens, block_size)
    x = F.embedding(input_ids, embed)  # [T, H]
    tokens, hd = x.shape[0], embed.shape[1] // num_heads
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
    for i in range(len(layers)):
        w = layers[i]  # input norm, q, k, v, o, post-attention norm, gate, up, down
        h = _rms_norm(x, w[0], eps)
        q = _rotate(F.linear(h, w[1]).view(tokens, num_heads, hd), cos, sin)
        k = _rotate(F.linear(h, w[2]).view(tokens, num_kv_heads, hd), cos, sin)
        v = F.linear(h, w[3]).view(tokens, num_kv_heads, hd)
        k_caches[i].view(-1, num_kv_heads, hd)[slot_mapping] = k
        v_caches[i].view(-1, num_kv_heads, hd)[slot_mapping] = v
        out = torch.empty_like(q)
        out[decode_rows] = _attend(q[decode_rows], k_caches[i], v_caches[i], blocks, seq, past,
                                   num_kv_heads, block_size, chunk_blocks)
        x = x + F.linear(out.view(tokens, num_heads * hd), w[4])
        h = _rms_norm(x, w[5], eps)
        x = x + F.linear(F.silu(F.linear(h, w[6])) * F.linear(h, w[7]), w[8])
    return F.linear(_rms_norm(x[sample_rows], norm, eps), head)


_SCRIPTED = None  # compiled on first use: compiling costs about a second


class ScriptedDecode:
    """The model's all-decode forward pass as one TorchScript call (CPU only): the model's weights as lists."""

    def __init__(self, model: Transformer) -> None:
        c = model.config
        self.layers = [[layer.input_layernorm.weight, layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                        layer.self_attn.v_proj.weight, layer.self_attn.o_proj.weight,
                        layer.post_attention_layernorm.weight, layer.mlp.gate_proj.weight,
                        layer.mlp.up_proj.weight, layer.mlp.down_proj.weight] for layer in model.layers]
        self.embed, self.norm = model.embed_tokens.weight, model.norm.weight
        self.head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        # rotary_cos_sin's inverse frequencies, as it computes them (they do not depend on the positions)
        exponent = torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim
        self.inv_freq = 1.0 / (c.rope_theta**exponent)
        self.config = c
        self._caches: tuple | None = None  # the runner's per-layer (K, V) list, and its Ks and Vs as two lists

    @staticmethod
    def handles(meta: AttentionMetadata, device: torch.device) -> bool:
        """Whether this call computes the batch: decodes only, on the CPU."""
        return device.type == "cpu" and not meta.prefill_query_ranges and meta.decode_rows.numel() > 0

    def __call__(self, input_ids: Tensor, positions: Tensor, caches: list[tuple[Tensor, Tensor]],
                 meta: AttentionMetadata, sample_rows: Tensor) -> Tensor:
        global _SCRIPTED
        if _SCRIPTED is None:
            with warnings.catch_warnings():  # TorchScript is deprecated for new models, not removed
                warnings.simplefilter("ignore", DeprecationWarning)
                _SCRIPTED = torch.jit.script(_decode_logits)
        if self._caches is None or self._caches[0] is not caches:
            self._caches = (caches, [k for k, _ in caches], [v for _, v in caches])
        c = self.config
        with torch.jit.optimized_execution(False):  # the plain interpreter: the eager ops, no fusion
            return _SCRIPTED(input_ids, positions, meta.slot_mapping, meta.decode_rows, meta.decode_block_tables,
                             meta.decode_context_lens, sample_rows, self.inv_freq, self.embed, self.layers,
                             self.norm, self.head, self._caches[1], self._caches[2], c.num_heads, c.num_kv_heads,
                             c.rms_norm_eps, meta.block_size, max(1, DECODE_CHUNK_KEYS // meta.block_size))
