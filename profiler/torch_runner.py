"""The real runner: a torch transformer over a paged KV cache, on the CPU or a CUDA device."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from itertrace.profiler.batch import Batch, SwapPlan
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


class _DecodeInputs:
    """Inputs of an all-decode batch of n sequences, preallocated and rewritten in place every iteration.

    Rows of one [4, n] host array (token ids, positions, slot mapping, context lengths) and of its
    device copy, which is the same memory on the CPU; a forward pass reads them before the next
    iteration writes them.
    """

    def __init__(self, n: int, device: torch.device) -> None:
        self.rows = np.arange(n)  # [n]; never written
        self.rows_tensor = torch.from_numpy(self.rows).to(device)
        self.host = np.zeros((4, n), dtype=np.int64)
        self.token_ids, self.positions, self.slots, self.context = self.host
        self._device = torch.from_numpy(self.host).to(device)  # [4, n]; the host array itself on the CPU
        self._rows = tuple(self._device)  # its rows, as tensors made once
        self._same_memory = device.type == "cpu"

    def upload(self) -> tuple[Tensor, ...]:
        """On the device: token ids, positions, slot mapping, context lengths ([n] each)."""
        if not self._same_memory:
            self._device.copy_(torch.from_numpy(self.host))
        return self._rows


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
        # empty().zero_() rather than zeros(): zeros() may get lazily mapped pages, and first-touch page
        # faults would then land inside the timed forward passes of the first requests
        self.kv_cache = torch.empty((c.num_layers, 2, num_blocks, *block_shape), dtype=c.torch_dtype,
                                    device=self.device).zero_()
        self.swap_pool = torch.zeros((c.num_layers, 2, swap_blocks, *block_shape), dtype=c.torch_dtype,
                                     pin_memory=self.device.type == "cuda")
        # Per layer (K, V), each [num_blocks, block_size, kv_heads, head_dim]: views into kv_cache.
        self.layer_caches = [(self.kv_cache[layer, 0], self.kv_cache[layer, 1]) for layer in range(c.num_layers)]
        self.sampler = Sampler()
        self._inputs: _DecodeInputs | None = None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Positions, slot mapping and attention metadata for the batch, as vector operations.

        Decodes (one token) are attended in one call, each over its own context; longer chunks one at a time.
        """
        if batch.block_size != self.block_size:
            raise ValueError(f"batch block_size {batch.block_size} != runner block_size {self.block_size}")
        if batch.num_seqs and batch.num_tokens_total == batch.num_seqs and batch.num_tokens.min() >= 1:
            return self._prepare_decodes(batch)  # every sequence runs one token
        self._check(batch)
        bs = self.block_size
        counts = batch.num_tokens  # [S]
        ends = np.cumsum(counts)  # [S] end row of each sequence in the flat batch
        starts = ends - counts
        seq_of_row = np.repeat(np.arange(batch.num_seqs), counts)  # [T]
        positions = batch.start_pos[seq_of_row] + (np.arange(len(seq_of_row)) - starts[seq_of_row])  # [T]
        blocks = batch.block_tables[seq_of_row, positions // bs]  # [T]
        slots = blocks * bs + positions % bs  # [T]
        context = batch.start_pos + counts  # [S]

        is_decode = counts == 1
        decode = np.flatnonzero(is_decode)
        width = int(-(-context[decode].max() // bs)) if len(decode) else 0
        tables = np.maximum(batch.block_tables[decode, :width], 0)  # [D, width]: padding reads block 0, masked
        prefill_ranges, prefill_tables, prefill_lens, prefill_masks = [], [], [], []
        for i in np.flatnonzero(~is_decode).tolist():
            ctx, first = int(context[i]), int(starts[i])
            pos = positions[first: int(ends[i])]
            prefill_ranges.append((first, int(ends[i])))
            prefill_tables.append(self._tensor(batch.block_tables[i, : -(-ctx // bs)]))
            prefill_lens.append(ctx)
            # query at position p may see keys at positions 0 .. p
            prefill_masks.append(self._tensor(np.arange(ctx)[None, :] <= pos[:, None]))  # [n, ctx]
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots),
            block_size=bs,
            prefill_query_ranges=prefill_ranges,
            prefill_block_tables=prefill_tables,
            prefill_context_lens=prefill_lens,
            prefill_masks=prefill_masks,
            decode_rows=self._tensor(ends[decode] - 1),
            decode_block_tables=self._tensor(tables),
            decode_context_lens=self._tensor(context[decode]),
        )
        return PreparedBatch(
            input_ids=self._tensor(batch.token_ids),
            positions=self._tensor(positions),
            meta=meta,
            sample_rows=self._tensor(ends[batch.sample] - 1),
        )

    def _prepare_decodes(self, batch: Batch) -> PreparedBatch:
        """The steady-state case: every sequence runs one token, so rows are sequences.

        Built in numpy (on the CPU each small torch op costs several microseconds, a numpy op about
        one) into inputs preallocated for this batch size, so a steady iteration makes one new tensor
        (the block tables). Checks as `_check` does, on the arrays built here; a table is taken to hold
        its blocks from the left, as the scheduler's do (-1 only after them).
        """
        bs, pos, tokens = self.block_size, batch.start_pos, batch.token_ids  # pos, tokens: [S]
        if tokens.view(np.uint64).max() >= self.vocab_size:  # a negative id reads as a huge unsigned one
            raise ValueError(f"batch {batch.iteration}: token id outside [0, {self.vocab_size})")
        longest = int(pos.max()) + 1  # the longest context
        if longest > self.config.max_position:
            self._check(batch)  # raises, naming the request
        width = -(-longest // bs)  # blocks the longest context needs
        block, offset = np.divmod(pos, bs)  # [S] each token's block in its table, and its place in it
        if width > batch.block_tables.shape[1]:
            self._check(batch)  # raises: a table is too short
        tables = batch.block_tables[:, :width]  # [S, width]
        inputs = self._decode_inputs(batch.num_seqs)
        newest = tables[inputs.rows, block]  # [S] the block each token is written to
        if newest.min() < 0 or batch.block_tables.max() >= self.num_blocks:
            self._check(batch)  # raises: a table is too short, or names a block outside the cache
        np.copyto(inputs.token_ids, tokens)
        np.copyto(inputs.positions, pos)
        np.multiply(newest, bs, out=inputs.slots)
        inputs.slots += offset
        np.add(pos, 1, out=inputs.context)
        ids_t, pos_t, slots_t, context_t = inputs.upload()
        # padding reads block 0, masked out; clamped in a contiguous copy (a ufunc over a strided
        # slice of the table costs several times as much)
        decode_tables = tables.copy()
        np.maximum(decode_tables, 0, out=decode_tables)
        meta = AttentionMetadata(
            slot_mapping=slots_t, block_size=bs,
            prefill_query_ranges=[], prefill_block_tables=[], prefill_context_lens=[], prefill_masks=[],
            decode_rows=inputs.rows_tensor,
            decode_block_tables=self._tensor(decode_tables),
            decode_context_lens=context_t,
        )
        all_sampled = len(batch.sampled_ids) == batch.num_seqs
        sample_rows = inputs.rows_tensor if all_sampled else self._tensor(inputs.rows[batch.sample])
        return PreparedBatch(input_ids=ids_t, positions=pos_t, meta=meta, sample_rows=sample_rows)

    def _decode_inputs(self, n: int) -> _DecodeInputs:
        """The preallocated inputs for n decodes (kept while n stays the same)."""
        if self._inputs is None or len(self._inputs.rows) != n:
            self._inputs = _DecodeInputs(n, self.device)
        return self._inputs

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

    def sample(self, batch: Batch, logits: Tensor) -> np.ndarray:
        """One token per sequence with sample=True, in batch order."""
        rows = np.flatnonzero(batch.sample)
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(rows)} sampling sequences")
        params = [batch.sampling[i] for i in rows.tolist()]
        tokens = self.sampler.sample(batch.request_ids[rows].tolist(), params, logits)
        return np.array(tokens, dtype=np.int64)

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

    def _check(self, batch: Batch) -> None:
        """Refuse a batch the cache cannot serve: wrong block size, short tables, ids out of range."""
        if not batch.num_seqs:
            return
        if batch.num_tokens.min() < 1:
            raise ValueError(f"request {int(batch.request_ids[batch.num_tokens.argmin()])}: no tokens to run")
        if batch.token_ids.min() < 0 or batch.token_ids.max() >= self.vocab_size:
            raise ValueError(f"batch {batch.iteration}: token id outside [0, {self.vocab_size})")
        context = batch.context_lens
        if context.max() > self.config.max_position:
            i = int(context.argmax())
            raise ValueError(f"request {int(batch.request_ids[i])}: context {int(context[i])} > max_position "
                             f"{self.config.max_position}")
        needed = -(-context // self.block_size)  # [S] blocks that must be in each table
        held = (batch.block_tables >= 0).sum(axis=1) if batch.block_tables.size else np.zeros_like(needed)
        short = np.flatnonzero(held < needed)
        if len(short):
            i = int(short[0])
            raise ValueError(f"request {int(batch.request_ids[i])}: {int(held[i])} blocks cannot hold "
                             f"{int(context[i])} tokens")
        if batch.block_tables.size and batch.block_tables.max() >= self.num_blocks:
            raise ValueError(f"batch {batch.iteration}: block id outside [0, {self.num_blocks})")

    def _pairs(self, pairs: list[tuple[int, int]], src_limit: int, dst_limit: int) -> tuple[list[int], list[int]]:
        """Split (source, destination) index pairs into two lists, checking each against its limit."""
        for src, dst in pairs:
            if not (0 <= src < src_limit and 0 <= dst < dst_limit):
                raise ValueError(f"swap pair ({src}, {dst}) outside [0, {src_limit}) x [0, {dst_limit})")
        return [src for src, _ in pairs], [dst for _, dst in pairs]

    def _tensor(self, array: np.ndarray) -> Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor if self.device.type == "cpu" else tensor.to(self.device)
