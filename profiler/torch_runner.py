"""The real runner: a torch transformer over a paged KV cache, on the CPU or a CUDA device."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from itertrace.profiler.batch import Batch, SeqWork, SwapPlan
from itertrace.profiler.checkpoint import load_checkpoint
from itertrace.profiler.model import AttentionMetadata, ModelConfig, random_model
from itertrace.profiler.sampling import Sampler


@dataclass(frozen=True)
class PreparedBatch:
    """Device inputs for one forward pass."""

    input_ids: Tensor  # [T]
    positions: Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: Tensor  # [S] row of the last token of each sequence with sample=True, in batch order


class TorchRunner:
    """Runs each iteration's batch through a real model; KV lives in `num_blocks` blocks of `block_size` tokens.

    The cache is one tensor [layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim] on the device;
    the swap pool has the same layout with `swap_blocks` blocks in CPU memory (pinned when on CUDA).
    """

    name = "torch"
    simulated = False

    def __init__(
        self,
        config: ModelConfig | None = None,
        *,
        checkpoint: str | Path | None = None,
        num_blocks: int,
        block_size: int,
        swap_blocks: int = 0,
        device: str | None = None,
        seed: int = 0,
    ) -> None:
        if config is not None and checkpoint is not None:
            raise ValueError("give a ModelConfig or a checkpoint, not both (a checkpoint has its own config)")
        if num_blocks <= 0 or block_size <= 0 or swap_blocks < 0:
            raise ValueError(f"bad cache size: {num_blocks=} {block_size=} {swap_blocks=}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if checkpoint is not None:
            self.model = load_checkpoint(checkpoint, device=self.device)
        else:
            self.model = random_model(config or ModelConfig(), seed=seed, device=self.device)
        self.config = self.model.config
        self.num_blocks, self.block_size, self.swap_blocks = num_blocks, block_size, swap_blocks
        c = self.config
        block_shape = (block_size, c.num_kv_heads, c.head_dim)
        self.kv_cache = torch.zeros((c.num_layers, 2, num_blocks, *block_shape), dtype=c.torch_dtype,
                                    device=self.device)
        self.swap_pool = torch.zeros((c.num_layers, 2, swap_blocks, *block_shape), dtype=c.torch_dtype,
                                     pin_memory=self.device.type == "cuda")
        # Per layer (K, V), each [num_blocks, block_size, kv_heads, head_dim]: views into kv_cache.
        self.layer_caches = [(self.kv_cache[layer, 0], self.kv_cache[layer, 1]) for layer in range(c.num_layers)]
        self.sampler = Sampler()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Flatten the batch's tokens and describe where each sequence's KV lives."""
        if batch.block_size != self.block_size:
            raise ValueError(f"batch block_size {batch.block_size} != runner block_size {self.block_size}")
        input_ids, positions, slots = [], [], []
        prefill_ranges, prefill_tables, prefill_lens, prefill_masks = [], [], [], []
        decode_rows, decode_tables, decode_lens = [], [], []
        sample_rows = []
        row = 0
        for seq in batch.seqs:
            table = self._check(seq)
            n, context_len = len(seq.token_ids), seq.context_len
            pos = np.arange(seq.start_pos, context_len)  # [n]
            input_ids.append(np.asarray(seq.token_ids))
            positions.append(pos)
            slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            used_table = table[: -(-context_len // self.block_size)]  # blocks holding [0, context_len)
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(used_table)
                decode_lens.append(context_len)
            else:
                prefill_ranges.append((row, row + n))
                prefill_tables.append(self._tensor(used_table))
                prefill_lens.append(context_len)
                # query i (position start_pos + i) may see keys at positions 0 .. start_pos + i
                prefill_masks.append(self._tensor(np.arange(context_len)[None, :] <= pos[:, None]))  # [n, ctx]
            row += n
            if seq.sample:
                sample_rows.append(row - 1)

        max_blocks = max((len(t) for t in decode_tables), default=0)
        padded_tables = np.zeros((len(decode_tables), max_blocks), dtype=np.int64)  # [D, max_blocks]
        for i, t in enumerate(decode_tables):
            padded_tables[i, : len(t)] = t
        key_in_context = np.arange(max_blocks * self.block_size)[None, :] < np.asarray(decode_lens)[:, None]
        meta = AttentionMetadata(
            slot_mapping=self._tensor(np.concatenate(slots) if slots else np.zeros(0, np.int64)),
            block_size=self.block_size,
            prefill_query_ranges=prefill_ranges,
            prefill_block_tables=prefill_tables,
            prefill_context_lens=prefill_lens,
            prefill_masks=prefill_masks,
            decode_rows=self._tensor(np.asarray(decode_rows, dtype=np.int64)),
            decode_block_tables=self._tensor(padded_tables),
            decode_mask=self._tensor(key_in_context[:, None, None, :]),  # [D, 1, 1, max_blocks * block_size]
        )
        return PreparedBatch(
            input_ids=self._tensor(np.concatenate(input_ids) if input_ids else np.zeros(0, np.int64)),
            positions=self._tensor(np.concatenate(positions) if positions else np.zeros(0, np.int64)),
            meta=meta,
            sample_rows=self._tensor(np.asarray(sample_rows, dtype=np.int64)),
        )

    def forward(self, prepared: PreparedBatch) -> Tensor:
        """Run the model, writing this iteration's KV; logits [S, vocab] for the sampling sequences."""
        with torch.inference_mode():
            if prepared.input_ids.numel():
                hidden = self.model(prepared.input_ids, prepared.positions, self.layer_caches, prepared.meta)  # [T, H]
                logits = self.model.compute_logits(hidden[prepared.sample_rows])  # [S, vocab]
            else:
                logits = torch.empty((0, self.vocab_size), dtype=self.config.torch_dtype, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return logits

    def sample(self, batch: Batch, logits: Tensor) -> dict[int, int]:
        """One token per sequence with sample=True, keyed by request id."""
        seqs = [seq for seq in batch.seqs if seq.sample]
        if logits.shape[0] != len(seqs):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(seqs)} sampling sequences")
        request_ids = [seq.request_id for seq in seqs]
        tokens = self.sampler.sample(request_ids, [seq.sampling for seq in seqs], logits)
        return dict(zip(request_ids, tokens))

    def swap(self, plan: SwapPlan) -> None:
        """Copy KV blocks device -> swap pool and swap pool -> device; every copy reads the state before the plan."""
        out_blocks, out_slots = self._pairs(plan.swap_out, self.num_blocks, self.swap_blocks)
        in_slots, in_blocks = self._pairs(plan.swap_in, self.swap_blocks, self.num_blocks)
        with torch.inference_mode():
            leaving = self.kv_cache[:, :, out_blocks].to("cpu")  # [layers, 2, n_out, block_size, kv_heads, hd]
            arriving = self.swap_pool[:, :, in_slots].to(self.device)  # [layers, 2, n_in, block_size, kv_heads, hd]
            self.swap_pool[:, :, out_slots] = leaving
            self.kv_cache[:, :, in_blocks] = arriving
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def release(self, request_id: int) -> None:
        """Drop a finished request's sampler state."""
        self.sampler.release(request_id)

    def _check(self, seq: SeqWork) -> np.ndarray:
        """The sequence's block table as an array, after checking it covers the sequence's context."""
        table = np.asarray(seq.block_table, dtype=np.int64)
        if not seq.token_ids:
            raise ValueError(f"request {seq.request_id}: no tokens to run")
        if min(seq.token_ids) < 0 or max(seq.token_ids) >= self.vocab_size:
            raise ValueError(f"request {seq.request_id}: token id outside [0, {self.vocab_size})")
        if seq.context_len > self.config.max_position:
            raise ValueError(f"request {seq.request_id}: context {seq.context_len} > max_position "
                             f"{self.config.max_position}")
        if len(table) * self.block_size < seq.context_len:
            raise ValueError(f"request {seq.request_id}: {len(table)} blocks cannot hold {seq.context_len} tokens")
        if len(table) and (table.min() < 0 or table.max() >= self.num_blocks):
            raise ValueError(f"request {seq.request_id}: block id outside [0, {self.num_blocks})")
        return table

    def _pairs(self, pairs: list[tuple[int, int]], src_limit: int, dst_limit: int) -> tuple[list[int], list[int]]:
        """Split (source, destination) index pairs into two lists, checking each against its limit."""
        for src, dst in pairs:
            if not (0 <= src < src_limit and 0 <= dst < dst_limit):
                raise ValueError(f"swap pair ({src}, {dst}) outside [0, {src_limit}) x [0, {dst_limit})")
        return [src for src, _ in pairs], [dst for _, dst in pairs]

    def _tensor(self, array: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
