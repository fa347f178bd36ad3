"""The torch runner's inputs for an all-decode batch, preallocated and rewritten in place every iteration."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from itertrace.profiler.runners.torch.torch_runner import PreparedBatch


class DecodeInputs:
    """Inputs of an all-decode batch of n sequences, preallocated and rewritten in place every iteration.

    Rows of one host array (token ids, slot mapping, positions, context lengths) and of its device
    copy, which is the same memory on the CPU; a forward pass reads them before the next iteration
    writes them. The block tables are read from the batch's own array, checked when a batch brings
    another array than the last one. The scheduler writes a handed-out tables array in one way only
    (see Batch): a -1 entry becomes the block the row's next token goes into, just before the batch
    of that token, whose slot check (`write`) then covers the new block id. On the CPU the tensor
    passed to attention is the array's own memory, so it sees such writes; on CUDA the tables are
    uploaded with the other inputs at every iteration, from pinned host buffers without waiting for
    the copies (the forward pass that reads them synchronizes before the next `write`). In overlap mode
    the runner keeps two of these and prepares into the one no forward pass is reading.
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
