"""Who yields when KV blocks run short: for a running prefill, and in the decode pass.

Notes
-----
A running request that needs a block when none is free preempts the lowest-ranked live member that
holds blocks and is not yet scheduled this iteration, or itself when no one else is left (`victim`).
The decode pass has the outcome of taking its rows one by one in policy order under that rule, each
taking a block when it needs one; `make_room` reaches it walking only the rows that need a block
and the members that yield. Blocks freed by preemption go to the back of the free list and growth
takes from the front, so growing after all the preemptions hands out the same blocks.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import repeat

from itertrace.profiler.scheduling.batch_builder import DecodeRows
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.scheduling.policies import SortKey
from itertrace.profiler.scheduling.request import Request


def victim(live: list[Request], work: list[tuple[Request, int]], needy: Request) -> Request:
    """The lowest-ranked live request holding blocks and not yet scheduled (the needy one if none).

    `live` is in policy order; `work` holds what this iteration has scheduled so far.
    """
    scheduled = {r.request_id for r, _ in work}
    for req in reversed(live):
        if req is not needy and req.phase.running and req.block_ids and req.request_id not in scheduled:
            return req
    return needy


def make_room(rows: DecodeRows, live: list[Request], grow: list[int], blocks: BlockManager, key: SortKey,
              preempt: Callable[[Request], None]) -> tuple[list[int], list[int]]:
    """Preempt until each growing row in turn (policy order) has a block; returns (rows granted, rows preempted).

    `live` holds the running members that are not decode rows, in policy order; `preempt` takes a
    request's blocks away. Granted rows have not taken their blocks yet: the caller grows them.
    """
    # the live members from the lowest rank up: rows carry their index, the others None
    tail = heapq.merge(zip(range(len(rows) - 1, -1, -1), reversed(rows.reqs)),
                       zip(repeat(None), reversed(live)), key=lambda t: key(t[1]), reverse=True)
    granted: list[int] = []
    yielded: list[int] = []
    for head in grow:
        needy = rows.reqs[head]
        if not needy.phase.running:
            continue  # preempted for a row ahead of it
        while blocks.device.num_free - len(granted) < 1:
            victim, index = needy, head
            for i, req in tail:  # rows before the head are scheduled; preempted members are skipped
                if req is not needy and req.phase.running and req.block_ids and (i is None or i > head):
                    victim, index = req, i
                    break
            preempt(victim)
            if index is not None:
                yielded.append(index)
            if victim is needy:
                break
        else:
            granted.append(head)
    return granted, sorted(yielded)
