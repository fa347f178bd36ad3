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

    Rows of one host array (token ids, slot mapping, positions, context lengths) and of its device
    copy, which is the same memory on the CPU; a forward pass reads them before the next iteration
    writes them. The block tables are read from the batch's own array, checked when a batch brings
    another array than the last one. The scheduler writes a handed-out tables array in one way only
    (see Batch): a -1 entry becomes the block the row's next token goes into, just before the batch
    of that token, whose slot check (`write`) then covers the new block id. On the CPU the tensor
    passed to attention is the array's own memory, so it sees such writes; on CUDA the tables are
    uploaded with the other inputs at every iteration, from pinned host buffers without waiting for
    the copies (the forward pass that reads them synchronizes before the next `write`).
    """

    def __init__(self, n: int, device: torch.device, block_size: int) -> None:
        self.rows = np.arange(n)  # [n]; never written
        self.rows_tensor = torch.from_numpy(self.rows).to(device)
        # [5, n]: token ids, slot mapping, positions, context lengths; then each position counted from the
        # start of the flattened tables (row i starts at i * max_blocks * block_size), not uploaded
        self.same_memory = device.type == "cpu"  # nothing to upload
        # on CUDA in pinned memory, so that its upload need not wait for the copy
        host = torch.zeros((5, n), dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host = host.numpy()
        self.token_ids, self.slots, self.positions, self.context, self._flat_pos = self.host
        self.checked = self.host[:3].view(np.uint64)  # token ids, slots, positions: negatives read as huge
        self._from_pos = self.host[2:]  # [3, n]: positions, context lengths, flat positions ...
        self._pos_offsets = np.zeros((3, n), dtype=np.int64)  # ... each position plus these
        self._pos_offsets[1] = 1
        self._scratch = np.empty(n, dtype=np.int64)
        self._device = device
        self._host = host[:4]
        self._host_on_device = self._host.to(device)  # [4, n]; the host array itself on the CPU
        self.on_device = tuple(self._host_on_device)  # its rows, as tensors made once
        # ufuncs over two arrays: a Python scalar operand costs more than the operation on a few hundred elements
        self.block_size, self._block_sizes = block_size, np.full(n, block_size)
        if block_size & (block_size - 1) == 0:  # a power of two, as block sizes are: shift and mask
            self._block_of, self._shift = np.right_shift, np.full(n, block_size.bit_length() - 1)
            self._offset_of, self._mask = np.bitwise_and, np.full(n, block_size - 1)
        else:
            self._block_of, self._shift = np.floor_divide, self._block_sizes
            self._offset_of, self._mask = np.remainder, self._block_sizes
        self.num_tokens: np.ndarray | None = None  # the last num_tokens array seen (all >= 1)
        self.sample: np.ndarray | None = None  # the last sample array seen, and its rows as a tensor
        self.sample_rows = self.rows_tensor
        self.tables: np.ndarray | None = None  # the last block tables array taken, and what follows from it:
        self.bad_block = False  # some block id lies outside the cache
        self._tables = np.empty((n, 0), dtype=np.int64)  # [n, max_blocks]: that array, or a contiguous copy of it
        self._tables_flat = self._tables.reshape(-1)  # ... flattened
        self._tables_host = torch.from_numpy(self._tables)  # ... as a tensor (the same memory; on CUDA a pinned copy)
        self._tables_on_device = self._tables_host.to(device)  # ... on the device (on the CPU: itself)
        self.width = 0  # columns of table_tensor
        self.table_tensor = self._tables_on_device  # [n, width]: the first columns of _tables_on_device
        self.prepared: PreparedBatch | None = None  # made from the tensors above, while they stay

    def take_tables(self, tables: np.ndarray, num_blocks: int) -> None:
        """Another block tables array: check its block ids against the cache and read the tables from it.

        An array that is not C-contiguous, writable int64 is copied, and then taken again with every
        batch, since writes to it would not reach the copy.
        """
        self.tables = None  # until it is in
        self.bad_block = bool(np.maximum.reduce(tables, None) >= num_blocks)
        self._tables = np.require(tables, np.int64, "CW")
        self._tables_flat = self._tables.reshape(-1)
        if self.same_memory:
            self._tables_host = self._tables_on_device = torch.from_numpy(self._tables)
        elif self._tables_host.shape != self._tables.shape:  # buffers of this shape, kept while it lasts
            self._tables_host = torch.empty(self._tables.shape, dtype=torch.int64, pin_memory=True)
            self._tables_on_device = torch.empty(self._tables.shape, dtype=torch.int64, device=self._device)
        np.multiply(self.rows, tables.shape[1] * self.block_size, self._pos_offsets[2])
        self.width, self.prepared = 0, None
        if self._tables is tables:
            self.tables = tables

    def write(self, tokens: np.ndarray, pos: np.ndarray) -> list[int]:
        """Write the inputs; the largest token id, slot and position (unsigned: a negative one reads as huge).

        A token at position p of row i goes to slot tables[i, p // bs] * bs + p % bs; a table too
        short for it has -1 there, which makes the slot negative.
        """
        self.token_ids[...] = tokens
        np.add(self._pos_offsets, pos, self._from_pos)  # positions, context lengths, flat positions at once
        index, slots = self._scratch, self.slots
        self._block_of(self._flat_pos, self._shift, index)  # [n] each token's block in the flattened tables
        # clip: an index past a row's table (found by the caller from the largest position) stays in bounds
        self._tables_flat.take(index, None, slots, "clip")
        np.multiply(slots, self._block_sizes, slots)
        self._offset_of(pos, self._mask, index)  # [n] each token's place in its block
        np.add(slots, index, slots)
        return np.maximum.reduce(self.checked, 1).tolist()

    def use_width(self, width: int) -> None:
        """Pass the first `width` columns of the tables on (blocks the longest context needs)."""
        self.width, self.prepared = width, None
        self.table_tensor = self._tables_on_device[:, :width]

    def upload(self) -> None:
        """Copy the host rows and the block tables to the device, where `on_device` and `table_tensor` hold them.

        The copies are queued before the forward pass's kernels on the same stream, from pinned memory
        that nothing writes until that forward pass has synchronized.
        """
        np.copyto(self._tables_host.numpy(), self._tables)
        self._host_on_device.copy_(self._host, non_blocking=True)
        self._tables_on_device.copy_(self._tables_host, non_blocking=True)


class TorchRunner:
    """Runs each iteration's batch through a real model; KV lives in `num_blocks` blocks of `block_size` tokens.

    The cache is one tensor [layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim] on the device;
    the swap pool has the same layout with `swap_blocks` blocks in CPU memory (pinned when on CUDA).
    """

    name = "torch"
    simulated = False
    reads_tokens = True
    runs_in_bulk = False  # a model's tokens come one forward pass at a time

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
        if self.device.type not in ("cpu", "cuda"):  # what it synchronizes, uploads and pins is for these two
            raise ValueError(f"device {self.device}: the torch runner runs on cpu or cuda")
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
        # what an all-decode batch is checked against: the largest token id, position and slot, plus one
        self._decode_limits = (self.config.vocab_size, self.config.max_position, num_blocks * block_size)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Positions, slot mapping and attention metadata for the batch, as vector operations.

        Decodes (one token) are attended in one call, each over its own context; longer chunks one at a time.
        An all-decode batch is prepared into tensors that the next one rewrites (it may even get the same
        PreparedBatch back): forward it before preparing another. What follows from a batch's arrays may be
        kept for the next batch that brings the same array objects, so an array must not be written once it
        is in a batch given to prepare, but in the one way Batch allows for block tables (as the scheduler
        does: a row's next block goes into its -1 entry just before the batch of that token).
        """
        if batch.block_size != self.block_size:
            raise ValueError(f"batch block_size {batch.block_size} != runner block_size {self.block_size}")
        n, inputs = batch.num_seqs, self._inputs
        if inputs is not None and batch.num_tokens is inputs.num_tokens and len(batch.token_ids) == n:
            # the num_tokens array of the last all-decode batch: checked then (a batch's arrays are never
            # written), and as long, so the same number of decodes
            return self._prepare_decodes(batch, inputs)
        if n and len(batch.token_ids) == n and batch.num_tokens.min() >= 1:  # every sequence runs one token
            if inputs is None or len(inputs.rows) != n:
                inputs = self._inputs = _DecodeInputs(n, self.device, self.block_size)
            inputs.num_tokens = batch.num_tokens
            return self._prepare_decodes(batch, inputs)
        return self._prepare_mixed(batch)

    def _prepare_mixed(self, batch: Batch) -> PreparedBatch:
        """Any batch: prefill chunks one at a time, decodes together."""
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

    def _prepare_decodes(self, batch: Batch, inputs: _DecodeInputs) -> PreparedBatch:
        """The steady-state case: every sequence runs one token, so rows are sequences.

        Its cost is per call, not per sequence (a numpy call costs about a microsecond, a torch op
        several), so a steady iteration makes about ten numpy calls into inputs preallocated for
        this batch size, the last of them one reduction that checks token ids, positions and slots
        together, and no tensor: the PreparedBatch is the last one, its tensors rewritten. The
        tables are checked against the cache, and the sample rows found, only when the batch brings
        another tables or sample array than the last one; a block written into the same tables
        since is the block of a token of this batch, which the slot check covers.

        Refuses what `_check` refuses, with its messages: any doubt goes to `_check`, and a batch it
        lets through to `_prepare_mixed`. A table is taken to hold its blocks from the left, as the
        scheduler's do (-1 only after them); its -1 padding is passed on as it is, since attention
        reads no table entry past a decode's context.
        """
        tables, bs = batch.block_tables, self.block_size  # tables: [S, max_blocks]
        if tables is not inputs.tables:
            if not tables.size:
                self._check(batch)  # raises: a decode needs a block
                return self._prepare_mixed(batch)
            inputs.take_tables(tables, self.num_blocks)
        top_token, top_slot, top_pos = inputs.write(batch.token_ids, batch.start_pos)
        width = top_pos // bs + 1  # blocks the longest context needs
        vocab, positions, slots = self._decode_limits
        if (top_token >= vocab or top_pos >= positions or top_slot >= slots or width > tables.shape[1]
                or inputs.bad_block):
            # a token id outside the vocabulary, a context past max_position, a table too short (its -1
            # made a slot negative) or a block id outside the cache: raises, naming the request
            self._check(batch)
            return self._prepare_mixed(batch)  # what _check lets through (a negative position)
        if width != inputs.width:
            inputs.use_width(width)
        if batch.sample is not inputs.sample:
            inputs.sample, inputs.prepared = batch.sample, None
            sampled = batch.sample.all()
            inputs.sample_rows = inputs.rows_tensor if sampled else self._tensor(inputs.rows[batch.sample])
        if not inputs.same_memory:
            inputs.upload()
        prepared = inputs.prepared
        if prepared is not None:  # the same tensors, rewritten in place
            prepared.meta.inputs_rewritten()
            return prepared
        ids_t, slots_t, pos_t, context_t = inputs.on_device
        meta = AttentionMetadata(
            slot_mapping=slots_t, block_size=bs,
            prefill_query_ranges=[], prefill_block_tables=[], prefill_context_lens=[], prefill_masks=[],
            decode_rows=inputs.rows_tensor,
            decode_block_tables=inputs.table_tensor,
            decode_context_lens=context_t,
        )
        inputs.prepared = PreparedBatch(input_ids=ids_t, positions=pos_t, meta=meta, sample_rows=inputs.sample_rows)
        return inputs.prepared

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
