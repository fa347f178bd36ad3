"""Paged KV blocks: a device pool and a swap pool, each a free list of fixed-size blocks."""
from __future__ import annotations

from itertools import repeat

import numpy as np

from itertrace.profiler.scheduling.request import Request


class OutOfBlocks(Exception):
    """The pool has fewer free blocks than asked for; nothing was allocated."""


class BlockPool:
    """A fixed number of blocks handed out from a FIFO free list (freed blocks go to the back).

    The free list is a list read from a moving head (`_free[_head:]`), so that taking a long prompt's
    hundreds of blocks is one slice, and each block's owner is a dict entry set and checked a whole
    request's blocks at a time.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks))  # free from _head on, first to be taken first
        self._head = 0
        self._owner: dict[int, int] = {}  # block id -> request id

    @property
    def num_free(self) -> int:
        return len(self._free) - self._head

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def free_ids(self) -> list[int]:
        """The free blocks, in the order they will be taken."""
        return self._free[self._head:]

    def _next(self, count: int) -> list[int]:
        """The next `count` free blocks, off the free list (the caller checked there are as many)."""
        head = self._head
        blocks = self._free[head: head + count]
        head += count
        if 2 * head > len(self._free) >= 64:  # drop the taken front now and then: the list stays within 2x the pool
            del self._free[:head]
            head = 0
        self._head = head
        return blocks

    def take(self, owner: int, count: int) -> list[int]:
        if count > self.num_free:
            raise OutOfBlocks(f"need {count} blocks, {self.num_free} free")
        blocks = self._next(count)
        self._owner.update(zip(blocks, repeat(owner)))
        return blocks

    def take_each(self, owners: list[int]) -> list[int]:
        """One block for each owner, in order."""
        if len(owners) > self.num_free:
            raise OutOfBlocks(f"need {len(owners)} blocks, {self.num_free} free")
        blocks = self._next(len(owners))
        self._owner.update(zip(blocks, owners))
        return blocks

    def give_back(self, owner: int, blocks: list[int]) -> None:
        """Return the owner's blocks to the back of the free list; a block it does not hold is an error,
        and then the pool is left as it was."""
        owners = self._owner
        held = list(map(owners.pop, blocks, repeat(None)))  # a block listed twice: None the second time
        if held.count(owner) != len(blocks):
            bad = next(b for b, h in zip(blocks, held) if h != owner)
            owners.update((b, h) for b, h in zip(blocks, held) if h is not None)
            raise RuntimeError(f"block {bad} is not held by request {owner}")
        self._free.extend(blocks)

    def owners(self) -> dict[int, int]:
        """Block id -> owning request id, for invariant checks."""
        return dict(self._owner)


class BlockManager:
    """Grows and releases per-request block tables; moves blocks to and from the swap pool."""

    def __init__(self, num_blocks: int, block_size: int, swap_blocks: int = 0) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.block_size = block_size
        self.device = BlockPool(num_blocks)
        self.swap = BlockPool(swap_blocks)
        self.allocated_this_iteration = 0
        self.freed_this_iteration = 0
        # overlap mode, per iteration the device has not finished (oldest first): its requests, and the blocks
        # freed from them meanwhile (owner, blocks)
        self._holds: list[tuple[set[int], list[tuple[int, list[int]]]]] = []

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, req: Request, new_tokens: int) -> int:
        """Device blocks the request must take to cache `new_tokens` more: growth plus any swapped-out ones."""
        held = len(req.block_ids) + len(req.swap_slots)
        return max(0, self.blocks_for(req.num_computed + new_tokens) - held) + len(req.swap_slots)

    def can_grow(self, req: Request, new_tokens: int) -> bool:
        return self.blocks_needed(req, new_tokens) <= self.device.num_free

    def grow(self, req: Request, new_tokens: int) -> None:
        """Append blocks to the request's table so `new_tokens` more tokens fit (all or nothing)."""
        need = self.blocks_needed(req, new_tokens)
        if need:
            req.block_ids.extend(self.device.take(req.request_id, need))
            self.allocated_this_iteration += need

    def append_blocks(self, reqs: list[Request]) -> list[int]:
        """One more block at the end of each request's table (all or nothing); returns the new block ids."""
        new = self.device.take_each([r.request_id for r in reqs])
        for req, block in zip(reqs, new):
            req.block_ids.append(block)
        self.allocated_this_iteration += len(new)
        return new

    def grow_to(self, req: Request, num_blocks: int) -> None:
        """Preallocate: extend the request's table to `num_blocks` blocks (all or nothing)."""
        need = max(0, num_blocks - len(req.block_ids))
        if need:
            req.block_ids.extend(self.device.take(req.request_id, need))
            self.allocated_this_iteration += need

    def free(self, req: Request, *, at_once: bool = False) -> None:
        """Release every device block and swap slot the request holds. The blocks of a request the device is
        still reading (`hold`) go back only when it is done (`release_held`), unless `at_once`."""
        if req.block_ids:
            pending = None if at_once else next(
                (freed for held, freed in reversed(self._holds) if req.request_id in held), None)
            if pending is not None:  # until the last iteration that reads them is done
                pending.append((req.request_id, req.block_ids))
            else:
                self.device.give_back(req.request_id, req.block_ids)
                self.freed_this_iteration += len(req.block_ids)
            req.block_ids = []
        if req.swap_slots:
            self.swap.give_back(req.request_id, req.swap_slots)
            req.swap_slots = []

    def hold(self, request_ids: np.ndarray) -> None:
        """Overlap mode: an iteration of these requests goes to the device. A block freed from one of them
        (but at_once) stays taken until the last such iteration is done (`release_held`), so that no other
        request gets it while the device may still read it."""
        self._holds.append((set(request_ids.tolist()), []))

    def release_held(self) -> None:
        """The device finished the oldest held iteration: the blocks waiting for it go back."""
        _, pending = self._holds.pop(0)
        for owner, blocks in pending:
            self.device.give_back(owner, blocks)
            self.freed_this_iteration += len(blocks)

    def pending(self) -> dict[int, int]:
        """Block id -> request id of the blocks freed while the device may still read them (invariant checks)."""
        return {b: owner for _, freed in self._holds for owner, blocks in freed for b in blocks}

    def swap_out(self, req: Request) -> list[tuple[int, int]]:
        """Move the request's blocks to swap slots; returns (device block, swap slot) copies to make."""
        slots = self.swap.take(req.request_id, len(req.block_ids))
        pairs = list(zip(req.block_ids, slots))
        self.device.give_back(req.request_id, req.block_ids)
        self.freed_this_iteration += len(req.block_ids)
        req.block_ids, req.swap_slots = [], slots
        return pairs

    def swap_in(self, req: Request) -> list[tuple[int, int]]:
        """Bring swapped blocks back into fresh device blocks; returns (swap slot, device block) copies."""
        blocks = self.device.take(req.request_id, len(req.swap_slots))
        self.allocated_this_iteration += len(blocks)
        pairs = list(zip(req.swap_slots, blocks))
        self.swap.give_back(req.request_id, req.swap_slots)
        req.block_ids, req.swap_slots = blocks, []
        return pairs

    def reset_counters(self) -> None:
        self.allocated_this_iteration = 0
        self.freed_this_iteration = 0
