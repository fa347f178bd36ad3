"""A runner that checks what the engine hands it, for the overlap tests (and the engine without overlap)."""
from __future__ import annotations

import numpy as np

from itertrace.profiler.scheduling.batch import Batch
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.request import Phase, Request


class CheckedRunner:
    """Passes every call on to `inner`, checking on the way, and raises on the first broken invariant:

    - every batch handed over names, for each row, only blocks its request holds (none free, none of
      another request's), as many as its context needs;
    - no row runs a request past its max_tokens;
    - a block goes back to the pool while an iteration that reads it is prepared or on the device only
      when its request was preempted (the iteration that reuses it runs after on the device);
    - a swap-in reads only a swap slot that a swap-out made before it filled.
    """

    def __init__(self, inner, blocks: BlockManager, requests: list[Request]) -> None:
        self.inner, self.blocks = inner, blocks
        # no decode_times: not a BulkRunner, so every batch goes through prepare, to be checked
        self.name, self.simulated, self.reads_tokens = inner.name, inner.simulated, inner.reads_tokens
        self.by_id = {r.request_id: r for r in requests}
        self.prepared: set[int] = set()  # requests of the batch prepared and not yet launched
        self.on_device: list[set[int]] = []  # requests of each batch launched and not yet collected, oldest first
        self.batches = 0
        self.filled: set[int] = set()  # swap slots that a swap-out made has filled
        give_back = blocks.device.give_back

        def checked_give_back(owner: int, returned: list[int]) -> None:
            if owner in self.prepared.union(*self.on_device):
                assert self.by_id[owner].phase is Phase.PREEMPTED, (
                    f"blocks {returned} of request {owner} ({self.by_id[owner].phase.value}) freed while the device reads them")
            give_back(owner, returned)

        blocks.device.give_back = checked_give_back

    def prepare(self, batch: Batch):
        self.batches += 1
        owners = self.blocks.device.owners()  # blocks freed and waiting for the device keep their owner
        bs = self.blocks.block_size
        for i, rid in enumerate(batch.request_ids.tolist()):
            need = -(-int(batch.start_pos[i] + batch.num_tokens[i]) // bs)
            table = batch.block_tables[i, :need].tolist()
            assert len(table) == need and all(b >= 0 for b in table), (batch.iteration, rid, table)
            for b in table:
                assert owners.get(b) == rid, (
                    f"iteration {batch.iteration}: request {rid}'s table names block {b}, held by {owners.get(b)}")
            req = self.by_id[rid]
            if batch.sample[i]:
                assert batch.num_generated[i] < req.sampling.max_tokens, (batch.iteration, rid, "past max_tokens")
        self.prepared = set(batch.request_ids.tolist())
        return self.inner.prepare(batch)

    def forward(self, prepared):
        self.on_device, self.prepared = [self.prepared], set()
        logits = self.inner.forward(prepared)
        self.on_device = []
        return logits

    def chains(self, batch: Batch) -> bool:
        return self.inner.chains(batch)

    def launch(self, prepared, swap, previous, on_device) -> None:
        assert not self.on_device or previous is None, "a second launch before the first was collected"
        assert len(self.on_device) < 2, "a third launch before the first was collected"
        self.on_device.append(self.prepared)
        self.prepared = set()
        self._swapped(swap)
        self.inner.launch(prepared, swap, previous, on_device)

    def collect(self):
        logits = self.inner.collect()
        self.on_device.pop(0)
        return logits

    def sample(self, batch: Batch, logits) -> np.ndarray:
        return self.inner.sample(batch, logits)

    def swap(self, plan) -> None:
        self._swapped(plan)
        self.inner.swap(plan)

    def _swapped(self, plan) -> None:
        """Every copy of a plan reads the state before it: the slots swap-ins read were filled earlier."""
        for slot, _ in plan.swap_in:
            assert slot in self.filled, f"swap-in from slot {slot}, which no swap-out made filled"
        self.filled -= {slot for slot, _ in plan.swap_in}
        self.filled |= {slot for _, slot in plan.swap_out}

    def release(self, request_id: int) -> None:
        self.inner.release(request_id)
