"""Whether the KV pools a run asks for fit the memory this machine has, checked before any is allocated."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from itertrace.errors import UserError

if TYPE_CHECKING:
    from itertrace.profiler.session import RunSpec

# Bytes a block id takes in a BlockPool's free list (a list of ints read from a moving head, which grows to
# at most twice the pool before its taken front is dropped), measured with tracemalloc: 40.0 fresh, 48 at most.
POOL_BYTES_PER_BLOCK = 48


def check_kv_memory(spec: RunSpec, cache_bytes_per_block: int = 0, on_gpu: bool = False) -> None:
    """UserError when the KV pools asked for cannot fit the memory this machine has free, before any is made.

    Every block costs its id in the free list; on the torch runner also its K and V for every layer
    (`cache_bytes_per_block`), in GPU memory on CUDA and in host memory otherwise (a swap block always)."""
    host_per_block = POOL_BYTES_PER_BLOCK + (0 if on_gpu else cache_bytes_per_block)
    swap_per_block = POOL_BYTES_PER_BLOCK + cache_bytes_per_block
    host = spec.num_blocks * host_per_block + spec.swap_blocks * swap_per_block
    free = available_memory_bytes()
    if host > free:
        flag, blocks, per = (("--swap-blocks", spec.swap_blocks, swap_per_block)
                             if spec.swap_blocks * swap_per_block > spec.num_blocks * host_per_block
                             else ("--num-blocks", spec.num_blocks, host_per_block))
        raise UserError(f"{flag} {blocks}: the KV blocks need {format_bytes(host)} of memory ({per:,} bytes a block), "
                        f"and this machine has {format_bytes(free)} available")
    if on_gpu:
        import torch

        gpu_free = torch.cuda.mem_get_info()[0]
        if spec.num_blocks * cache_bytes_per_block > gpu_free:
            raise UserError(f"--num-blocks {spec.num_blocks}: the KV cache needs "
                            f"{format_bytes(spec.num_blocks * cache_bytes_per_block)} of GPU memory "
                            f"({cache_bytes_per_block:,} bytes a block), and the GPU has {format_bytes(gpu_free)} free")


def available_memory_bytes() -> int:
    """Memory the kernel can give this process now (MemAvailable), or all physical memory where that is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def format_bytes(n: int) -> str:
    """`n` bytes in TB, GB or MB to one decimal, or in bytes below a megabyte."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,} bytes"
