"""A Llama-style decoder-only transformer whose attention reads and writes a paged KV cache."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model; the defaults give a small byte-level model that runs fast on a CPU."""

    vocab_size: int = 260  # 256 bytes + specials
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 688
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 4096
    tie_word_embeddings: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPES)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each sequence's tokens sit in the flat batch and in the paged KV cache.

    Prefill chunks (more than one query token) are attended one sequence at a time; decodes (one query
    token) are attended together in one varlen call that reads each decode's own context and nothing
    more, as a paged attention kernel does: its cost follows the sum of the decodes' contexts, which
    is what the simulated runner's cost model charges (a padded call would read decodes x longest
    context, and so charge a batch that mixes long and short contexts, as continuous batching makes,
    for keys it never uses).
    """

    slot_mapping: Tensor  # [T] cache slot that receives each token's K and V
    block_size: int
    # Prefill chunks, one entry per chunk.
    prefill_query_ranges: list[tuple[int, int]]  # (first row, end row) in the flat batch
    prefill_block_tables: list[Tensor]  # [ceil(context_len / block_size)] each
    prefill_context_lens: list[int]
    prefill_masks: list[Tensor]  # [n, context_len] bool, True = may attend (causal, offset by start_pos)
    # Decodes, all together.
    decode_rows: Tensor  # [D] row of each decode token in the flat batch
    decode_block_tables: Tensor  # [D, max_blocks]; entries past ceil(context / block_size) are never read
    decode_context_lens: Tensor  # [D] keys each decode attends to

    def inputs_rewritten(self) -> None:
        """Its tensors were rewritten in place (a runner reusing its inputs): drop what was derived from them."""
        self.__dict__.pop("decode_keys", None)  # the cached_properties' values
        self.__dict__.pop("decode_tree", None)

    @cached_property
    def decode_keys(self) -> tuple[Tensor, Tensor, Tensor]:
        """The decodes' cache blocks as one flat list: block ids [B], the decode each belongs to [B], and
        [B, block_size] True where a key lies past its decode's context (only in a decode's last block).

        B is the sum of the decodes' ceil(context / block_size). Built once per forward, on the model's
        side, as a varlen attention kernel would: prepare only states block tables and lengths.
        """
        bs, lens, tables = self.block_size, self.decode_context_lens, self.decode_block_tables  # lens: [D]
        held = torch.div(lens + bs - 1, bs, rounding_mode="floor")  # [D] blocks each context fills
        seq, j = (torch.arange(tables.shape[1], device=lens.device)[None, :] < held[:, None]).nonzero(as_tuple=True)
        past = (j * bs)[:, None] + torch.arange(bs, device=lens.device)[None, :] >= lens[seq][:, None]  # [B, bs]
        return tables[seq, j], seq, past

    @cached_property
    def decode_tree(self) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        """The steps of `tree_segment_sum`, worked out once per forward for every layer's sums.

        Step k (step = 2**k, while below the tables' width): [B] True for a block whose place among its
        decode's blocks is a multiple of 2 * step and whose decode holds a block `step` places after it,
        and [B] the block each block reads (that one, or itself). Then [D] each decode's first block
        in the flat list, or B for a decode that holds none.
        """
        _, seq, _ = self.decode_keys
        held = torch.bincount(seq, minlength=len(self.decode_context_lens))  # [D] blocks of each decode
        first = torch.cumsum(held, 0) - held  # [D]
        rows = torch.arange(len(seq), device=seq.device)
        place, count = rows - first[seq], held[seq]  # [B] place among its decode's blocks, and their number
        steps, step = [], 1
        while step < self.decode_block_tables.shape[1]:
            adds = (place % (2 * step) == 0) & (place + step < count)
            steps.append((adds, torch.where(adds, rows + step, rows)))
            step *= 2
        return steps, torch.where(held > 0, first, len(seq))


def segment_sum(x: Tensor, seq: Tensor, meta: AttentionMetadata) -> Tensor:
    """[D, ...] the sum of the rows of x ([B, ...], grouped by decode as in `decode_keys`) over each decode.

    The same value on every run: on the CPU `index_add_` adds in order; on CUDA it adds with atomics,
    in an order that changes from run to run, so there the rows go through `tree_segment_sum`.
    """
    if x.device.type == "cpu":
        return torch.zeros((len(meta.decode_context_lens), *x.shape[1:]), dtype=x.dtype).index_add_(0, seq, x)
    return tree_segment_sum(x, meta)


def tree_segment_sum(x: Tensor, meta: AttentionMetadata) -> Tensor:
    """`segment_sum` in a fixed order on any device: a pairwise tree within each decode's blocks.

    At each step (`decode_tree`) a block adds the block `step` places after it in its decode, so after
    ceil(log2(W)) steps (W: the tables' width) each decode's first block holds its sum. Every step is
    elementwise over the B blocks (three kernels), so the cost stays linear in the blocks read (times
    log2 W), whatever the mix of long and short contexts.
    """
    steps, first = meta.decode_tree
    shape = (len(x),) + (1,) * (x.dim() - 1)
    for adds, reads in steps:
        x = torch.where(adds.view(shape), x + x.index_select(0, reads), x)
    return torch.cat((x, x.new_zeros((1, *x.shape[1:])))).index_select(0, first)


# Keys one step of decode attention reads at a time: 1024 keys x 4 heads x 64 dims in float32 is 1 MiB
# per temporary, which stays in a core's cache; unchunked, a 16-decode batch of 1000-token contexts
# made 16 MiB temporaries and cost about twice as much per key as a short one.
DECODE_CHUNK_KEYS = 1024


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32 like HF Llama."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # x: [T, H]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin tables for the "rotate_half" rotary convention (HF Llama), one row per token."""
    # positions: [T] -> cos, sin: [T, 1, head_dim]
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)  # [head_dim / 2]
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (i, i + head_dim/2) of every head by its token's position angle."""
    # x: [T, heads, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def gather_blocks(cache: Tensor, block_ids: Tensor) -> Tensor:
    """The cache blocks named by `block_ids`, copied out in that order."""
    # cache: [num_blocks, block_size, kv_heads, hd]; block_ids: [...] -> [..., block_size, kv_heads, hd]
    # index_select on a 2-D view copies whole blocks; on the CPU it is several times faster than cache[block_ids]
    rows = torch.index_select(cache.view(cache.shape[0], -1), 0, block_ids.reshape(-1))
    return rows.view(*block_ids.shape, *cache.shape[1:])


class Attention(nn.Module):
    """Grouped-query attention over a paged KV cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        hidden, kv_dim = config.hidden_size, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(hidden, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, hidden, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        # x: [T, H]; cos, sin: [T, 1, head_dim]; k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim]
        tokens = x.shape[0]
        q = apply_rotary(self.q_proj(x).view(tokens, self.num_heads, self.head_dim), cos, sin)  # [T, heads, hd]
        k = apply_rotary(self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim), cos, sin)  # [T, kv, hd]
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)  # [T, kv_heads, head_dim]
        k_cache.view(-1, self.num_kv_heads, self.head_dim)[meta.slot_mapping] = k
        v_cache.view(-1, self.num_kv_heads, self.head_dim)[meta.slot_mapping] = v

        out = torch.empty_like(q)  # [T, heads, head_dim]
        for (first, end), blocks, context_len, mask in zip(
            meta.prefill_query_ranges, meta.prefill_block_tables, meta.prefill_context_lens, meta.prefill_masks
        ):
            keys = gather_blocks(k_cache, blocks).flatten(0, 1)[:context_len]  # [ctx, kv_heads, head_dim]
            values = gather_blocks(v_cache, blocks).flatten(0, 1)[:context_len]
            out[first:end] = self._attend(q[first:end].transpose(0, 1), keys, values, mask).transpose(0, 1)
        if meta.decode_rows.numel():
            out[meta.decode_rows] = self._attend_decodes(q[meta.decode_rows], k_cache, v_cache, meta)
        return self.o_proj(out.view(tokens, self.num_heads * self.head_dim))

    def _attend_decodes(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
        """One query token per decode against exactly its own context's blocks (varlen: no padding).

        Over the flat list of the decodes' blocks: scores, a softmax within each decode's keys (segment
        max, exp, segment sum) and the weighted sum of values. Keys and values are read in chunks of
        DECODE_CHUNK_KEYS, so the temporaries stay in a core's cache and the cost stays linear in the sum
        of the decodes' contexts (rounded up to whole blocks) at any batch size.
        """
        # q: [D, heads, hd]; k_cache, v_cache: [num_blocks, block_size, kv_heads, hd] -> [D, heads, hd]
        blocks, seq, past = meta.decode_keys  # [B], [B], [B, bs]
        d, kv, group, hd = q.shape[0], self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        n, bs = len(blocks), meta.block_size
        step = max(1, DECODE_CHUNK_KEYS // bs)  # blocks per chunk
        # query head h reads KV head h // group, as in HF's repeat_kv
        queries = torch.index_select(q.view(d, kv, group, hd), 0, seq)[:, None]  # [B, 1, kv_heads, group, hd]
        scores = torch.empty((n, bs, kv, group), dtype=q.dtype, device=q.device)
        for c in range(0, n, step):
            keys = gather_blocks(k_cache, blocks[c:c + step])[:, :, :, None, :]  # [b, bs, kv_heads, 1, hd]
            torch.sum(keys * queries[c:c + step], -1, out=scores[c:c + step])
        scores.mul_(hd**-0.5).masked_fill_(past[:, :, None, None], float("-inf"))
        index = seq[:, None, None].expand(n, kv, group)  # [B, kv_heads, group]
        peak = torch.full((d, kv, group), float("-inf"), dtype=q.dtype, device=q.device)
        peak = peak.scatter_reduce(0, index, scores.amax(1), "amax")  # [D, kv_heads, group]
        weights = (scores - peak.index_select(0, seq)[:, None]).exp()[..., None]  # [B, bs, kv_heads, group, 1]
        total = segment_sum(weights.sum((1, 4)), seq, meta)  # [D, kv_heads, group]
        part = torch.empty((n, kv, group, hd), dtype=q.dtype, device=q.device)
        for c in range(0, n, step):
            values = gather_blocks(v_cache, blocks[c:c + step])[:, :, :, None, :]  # [b, bs, kv_heads, 1, hd]
            torch.sum(weights[c:c + step] * values, 1, out=part[c:c + step])
        out = segment_sum(part, seq, meta)  # [D, kv_heads, group, hd]
        return (out / total[..., None]).view(d, self.num_heads, hd)

    def _attend(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """Scaled dot-product attention with each KV head shared by num_heads / num_kv_heads query heads."""
        # q: [..., heads, n, hd]; keys, values: [..., ctx, kv_heads, hd]; mask broadcasts to [..., heads, n, ctx]
        keys, values = keys.transpose(-3, -2), values.transpose(-3, -2)  # [..., kv_heads, ctx, hd]
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # query head h reads KV head h // group, as in HF's repeat_kv
            keys, values = keys.repeat_interleave(group, dim=-3), values.repeat_interleave(group, dim=-3)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [..., heads, n, hd]


class MLP(nn.Module):
    """Gated SiLU feed-forward block."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        # x: [T, H]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residual connections."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        # x: [T, H]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """The whole model; parameter names are HF Llama's without the `model.` prefix."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        tied = config.tie_word_embeddings
        self.lm_head = None if tied else nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self, input_ids: Tensor, positions: Tensor, kv_caches: list[tuple[Tensor, Tensor]], meta: AttentionMetadata
    ) -> Tensor:
        """Hidden states after the last layer (before the final norm) for every token."""
        # input_ids, positions: [T] -> [T, H]
        x = self.embed_tokens(input_ids)  # [T, H]
        cos, sin = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, k_cache, v_cache, meta)
        return x

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """Final norm and output projection."""
        # hidden: [S, H] -> [S, vocab]
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm(hidden), weight)


def empty_model(config: ModelConfig, device: torch.device | str) -> Transformer:
    """A model with uninitialised weights of the config's dtype on `device` (no RNG, no init cost)."""
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to_empty(device=device).to(config.torch_dtype)
    return model.requires_grad_(False).eval()


def random_model(config: ModelConfig, *, seed: int = 0, device: torch.device | str = "cpu") -> Transformer:
    """A model with weights drawn from N(0, 0.02) (norms at 1) by a generator seeded with `seed`."""
    model = empty_model(config, device)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:  # drawn in float32 on the CPU, so every device and dtype sees the same numbers
                param.copy_(torch.empty(param.shape).normal_(0.0, 0.02, generator=generator))
    return model

