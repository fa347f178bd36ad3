"""gcquiet.no_full_collections: no full collector passes in the block, young ones still free cycles."""
from __future__ import annotations

import gc
import weakref

from itertrace.profiler.gcquiet import no_full_collections


class _Node:
    pass


def _full_passes_while_growing(n: int) -> int:
    """Full (generation 2) collections while n long-lived container objects are made."""
    passes = 0

    def count(phase: str, info: dict) -> None:
        nonlocal passes
        passes += phase == "start" and info["generation"] == 2

    gc.collect()
    gc.callbacks.append(count)
    try:
        kept = [[i] for i in range(n)]  # as a run's requests and log rows: many, long-lived, acyclic
        del kept
    finally:
        gc.callbacks.remove(count)
    return passes


def test_no_full_passes_inside_the_block_and_thresholds_restored():
    before = gc.get_threshold()
    assert _full_passes_while_growing(2_000_000) > 0  # the collector's default behaviour
    with no_full_collections():
        assert _full_passes_while_growing(2_000_000) == 0
    assert gc.get_threshold() == before


def test_young_collections_still_free_cycles_in_the_block():
    with no_full_collections():
        node = _Node()
        node.self = node  # a reference cycle: only the collector frees it
        alive = weakref.ref(node)
        del node
        kept = [[i] for i in range(100_000)]  # enough new containers for young collections to run
        assert alive() is None
        del kept
