"""The real runner: a torch transformer over a paged KV cache, on the CPU or a CUDA device."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from itertrace.profiler.scheduling.batch import Batch, Placeholders, SwapPlan
from itertrace.profiler.runners.torch.checkpoint import load_checkpoint
from itertrace.profiler.runners.torch.decode_inputs import DecodeInputs
from itertrace.profiler.runners.torch.launcher import Launcher
from itertrace.profiler.runners.torch.model import AttentionMetadata, ModelConfig, random_model
from itertrace.profiler.runners.torch.sampling import Sampler
from itertrace.profiler.runners.torch.scripted_decode import ScriptedDecode


@dataclass
class PreparedBatch:
    """Device inputs for one forward pass."""

    input_ids: Tensor  # [T]
    positions: Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: Tensor  # [S] row of the last token of each sequence with sample=True, in batch order
    # overlap mode: the placeholder tokens in input_ids, which launch puts in; None when there are none
    placeholders: Placeholders | None = None


class TorchRunner:
    """Runs each iteration's batch through a real model; KV lives in `num_blocks` blocks of `block_size` tokens.

    The cache is one tensor [layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim] on the device;
    the swap pool has the same layout with `swap_blocks` blocks in CPU memory (pinned when on CUDA).
    """

    name = "torch"
    simulated = False
    reads_tokens = True

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
        self._scripted = ScriptedDecode(self.model)  # all-decode batches on the CPU, without the GIL
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
        # decode inputs, two so that overlap mode prepares into one while a forward pass reads the other
        self._inputs: list[DecodeInputs | None] = [None, None]
        self._prepared_in: int | None = None  # which of them the last prepared batch uses (None: neither)
        self._reading: deque[int | None] = deque()  # which of them each forward pass in flight reads (overlap)
        self._launcher = Launcher(self.device)  # overlap mode: runs forward passes beside the host
        # overlap mode on the CPU: the greedy tokens of the last forward pass, argmaxed on the device thread,
        # which a chained launch puts into the next one's placeholders; and those of the last one collected
        self._device_tokens: Tensor | None = None
        self._collected: tuple[Tensor, Tensor] | None = None
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
        slot = 1 if 0 in self._reading else 0  # not the inputs a forward pass on the device reads
        n, inputs = batch.num_seqs, self._inputs[slot]
        self._prepared_in = None
        if inputs is not None and batch.num_tokens is inputs.num_tokens and len(batch.token_ids) == n:
            # the num_tokens array of the last all-decode batch: checked then (a batch's arrays are never
            # written), and as long, so the same number of decodes
            self._prepared_in = slot
            return self._prepare_decodes(batch, inputs)
        if n and len(batch.token_ids) == n and batch.num_tokens.min() >= 1:  # every sequence runs one token
            if inputs is None or len(inputs.rows) != n:
                inputs = self._inputs[slot] = DecodeInputs(n, self.device, self.block_size)
            inputs.num_tokens = batch.num_tokens
            self._prepared_in = slot
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
        placeholders = Placeholders.find(batch.token_ids) if len(batch.token_ids) else None
        return PreparedBatch(
            # launch writes the placeholders' tokens into a copy: a batch's arrays are never written
            input_ids=self._tensor(batch.token_ids if placeholders is None else batch.token_ids.copy()),
            positions=self._tensor(positions),
            meta=meta,
            sample_rows=self._tensor(ends[batch.sample] - 1),
            placeholders=placeholders,
        )

    def _prepare_decodes(self, batch: Batch, inputs: DecodeInputs) -> PreparedBatch:
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
        placeholders = None
        if top_token >= vocab and (placeholders := Placeholders.find(batch.token_ids)) is not None:
            top_token = int(batch.token_ids.max())  # the others' tokens are checked, the placeholders' put in later
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
            prepared.placeholders = placeholders
            return prepared
        ids_t, slots_t, pos_t, context_t = inputs.on_device
        meta = AttentionMetadata(
            slot_mapping=slots_t, block_size=bs,
            prefill_query_ranges=[], prefill_block_tables=[], prefill_context_lens=[], prefill_masks=[],
            decode_rows=inputs.rows_tensor,
            decode_block_tables=inputs.table_tensor,
            decode_context_lens=context_t,
        )
        inputs.prepared = PreparedBatch(input_ids=ids_t, positions=pos_t, meta=meta, sample_rows=inputs.sample_rows,
                                        placeholders=placeholders)
        return inputs.prepared

    def forward(self, prepared: PreparedBatch) -> Tensor:
        """Run the model, writing this iteration's KV; logits [S, vocab] for the sampling sequences."""
        logits = self._logits(prepared)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return logits

    def _logits(self, prepared: PreparedBatch) -> Tensor:
        """The model's forward pass, queued on the current stream on CUDA."""
        if prepared.placeholders is not None:
            raise ValueError("the batch's token ids hold placeholders: launch puts their tokens in, forward cannot")
        with torch.inference_mode():
            if ScriptedDecode.handles(prepared.meta, self.device):
                return self._scripted(prepared.input_ids, prepared.positions, self.layer_caches, prepared.meta,
                                      prepared.sample_rows)
            if prepared.input_ids.numel():
                hidden = self.model(prepared.input_ids, prepared.positions, self.layer_caches, prepared.meta)  # [T, H]
                return self.model.compute_logits(hidden[prepared.sample_rows])  # [S, vocab]
            return torch.empty((0, self.vocab_size), dtype=self.config.torch_dtype, device=self.device)

    # ---- overlap mode ---------------------------------------------------------------------------------
    def chains(self, batch: Batch) -> bool:
        """Whether the next iteration may be launched before this one (in flight) is collected: on the CPU,
        when every row of `batch` is greedy, its tokens are argmaxed on the device thread, which puts them
        into the next one's placeholders itself (as a GPU engine samples on the device), so the device goes
        from one forward pass to the next without waiting for the host."""
        return self._launcher.depth > 1 and all(p.temperature == 0.0 for p in batch.sampling)

    def launch(self, prepared: PreparedBatch, swap: SwapPlan, previous: np.ndarray | None, on_device) -> None:
        """Start the swaps and the forward pass and return while they run (see Launcher); the placeholders get
        `previous`'s tokens first, or, with `previous` None behind a forward pass in flight (see `chains`),
        that one's greedy tokens, on the device thread."""
        chained = previous is None and prepared.placeholders is not None and self._launcher.in_flight > 0
        if not chained:
            self._put_tokens(prepared, previous)
        self._reading.append(self._prepared_in)
        on_cpu = self.device.type == "cpu"

        def work(ready: Callable[[], None]) -> Tensor | tuple[Tensor, Tensor]:
            if chained:
                tokens, self._device_tokens = self._device_tokens, None
                self._put_tokens(prepared, None if tokens is None else tokens.numpy())
            if swap.swap_out or swap.swap_in:
                self.swap(swap)
            ready()  # the forward pass before this one may be collected now (see launcher._device_loop)
            logits = self._logits(prepared)
            if not on_cpu:
                return logits
            self._device_tokens = logits.to(torch.float32).argmax(-1)  # as Sampler does for greedy rows
            return logits, self._device_tokens

        try:
            self._launcher.launch(work, on_device, prepared)
        except BaseException:
            self._reading.pop()
            raise

    def collect(self) -> Tensor:
        """Wait for the oldest forward pass launched; its logits (on CUDA in pinned host memory)."""
        try:
            out = self._launcher.collect()
        finally:
            if self._reading:
                self._reading.popleft()
        logits, tokens = out if isinstance(out, tuple) else (out, None)
        self._collected = None if tokens is None else (logits, tokens)
        return logits

    def _put_tokens(self, prepared: PreparedBatch, previous: np.ndarray | None) -> None:
        """Write the previous iteration's tokens where the batch has placeholders."""
        if prepared.placeholders is None:
            return
        at, rows = prepared.placeholders
        if previous is None or int(rows.max()) >= len(previous):
            raise ValueError(f"placeholders for {int(rows.max()) + 1} tokens of the previous iteration, "
                             f"{0 if previous is None else len(previous)} given")
        tokens = torch.from_numpy(previous[rows])
        if self.device.type == "cuda":
            prepared.input_ids[torch.from_numpy(at).to(self.device)] = tokens.to(self.device)
        else:
            prepared.input_ids[torch.from_numpy(at)] = tokens
        prepared.placeholders = None

    def sample(self, batch: Batch, logits: Tensor) -> np.ndarray:
        """One token per sequence with sample=True, in batch order."""
        rows = np.flatnonzero(batch.sample)
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(rows)} sampling sequences")
        params = [batch.sampling[i] for i in rows.tolist()]
        collected, self._collected = self._collected, None
        if collected is not None and collected[0] is logits and all(p.temperature == 0.0 for p in params):
            return collected[1].numpy()  # argmaxed on the device thread
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
        if batch.token_ids.max() >= self.vocab_size:  # a negative one is a placeholder (Placeholders)
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
