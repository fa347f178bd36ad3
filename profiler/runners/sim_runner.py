"""The simulated runner: no model, a decode-time cost model that moves a virtual clock."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from itertrace.profiler.scheduling.batch import Batch, SwapPlan
from itertrace.profiler.clock import SimClock


@dataclass(frozen=True)
class CostModel:
    """Iteration time = fixed + per sequence + per scheduled token + per context token read (+ per swapped block).

    Context tokens are each sequence's own context (start position + tokens), as a paged (varlen)
    attention kernel reads them; the torch runner's attention reads the same (profiler/runners/torch/model.py).
    """

    fixed_ns: float = 8_000_000.0  # weights read once per iteration
    per_token_ns: float = 60_000.0  # each scheduled token's matmul share
    per_context_token_ns: float = 150.0  # attention reads of cached KV
    per_swap_block_ns: float = 20_000.0
    source: str = "default"  # "default", or where calibrated coefficients came from
    per_seq_ns: float = 0.0  # each sequence's own work: its attention call's share, sampling, bookkeeping
    # the host's work of an iteration besides the forward pass (scheduling, inputs, sampling, output),
    # charged in prepare: an iteration takes host + device time, or in overlap mode the larger of the two
    host_ns: float = 0.0

    def forward_ns(self, batch: Batch) -> int:
        tokens = len(batch.token_ids)
        context = int(batch.start_pos.sum()) + tokens  # KV positions attention reads, as a paged kernel does
        return int(self._ns(len(batch.start_pos), tokens, context))

    def decode_steps_ns(self, batch: Batch, steps: int) -> np.ndarray:
        """[steps] `forward_ns` of a batch and of the `steps - 1` batches that follow it, each row as many
        positions further as it runs tokens: the same arithmetic, on an array of contexts."""
        tokens = len(batch.token_ids)
        context = int(batch.start_pos.sum()) + tokens + tokens * np.arange(steps, dtype=np.int64)
        return self._ns(len(batch.start_pos), tokens, context).astype(np.int64)

    def _ns(self, seqs: int, tokens: int, context):
        """The model, for one context or an array of them (the same operations in the same order)."""
        return self.fixed_ns + self.per_seq_ns * seqs + self.per_token_ns * tokens + self.per_context_token_ns * context


def _tokens(request_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
    """The token a request samples after `generated` tokens: printable ASCII, varying with request and
    step, so detokenized text is readable."""
    return 32 + (request_ids * 7 + generated) % 95


class SimulatedRunner:
    """A BulkRunner and an OverlapRunner (batch.py); sampled tokens are deterministic stand-ins, never a stop token."""

    name = "simulated"
    simulated = True
    reads_tokens = False  # the cost model counts tokens; it never reads them

    def __init__(self, clock: SimClock, cost: CostModel | None = None) -> None:
        self.clock = clock
        self.cost = cost or CostModel()
        self._device_done_ns = 0  # overlap mode: when the launched forward pass ends

    def prepare(self, batch: Batch) -> Batch:
        if self.cost.host_ns:
            self.clock.advance(self.cost.host_ns)
        return batch

    def launch(self, prepared: Batch, swap: SwapPlan, previous: np.ndarray | None, on_device) -> None:
        """The device starts now (its last pass was collected) and takes the swaps' and the forward pass's time
        while the clock, the host's, goes on."""
        start = self.clock.now_ns()
        self._device_done_ns = start + self._swap_ns(swap) + self.cost.forward_ns(prepared)
        on_device.span(start, self._device_done_ns)

    def collect(self) -> None:
        self.clock.sleep_until(self._device_done_ns)

    def chains(self, batch: Batch) -> bool:
        """Never: its tokens come from the host after each forward pass."""
        return False

    def forward(self, prepared: Batch) -> None:
        self.clock.advance(self.cost.forward_ns(prepared))

    def sample(self, batch: Batch, logits: None) -> np.ndarray:
        return _tokens(batch.sampled_ids, batch.num_generated[batch.sample])

    def decode_times(self, batch: Batch, steps: int) -> tuple[int, np.ndarray]:
        """What `prepare` moves the clock by in each of `steps` iterations of a batch, each row as many
        positions further than in the last as it runs tokens, and [steps] what `forward` does. The clock does
        not move (the engine moves it)."""
        return int(self.cost.host_ns), self.cost.decode_steps_ns(batch, steps)

    def step_times(self, seqs: np.ndarray, tokens: np.ndarray, context: np.ndarray) -> tuple[int, np.ndarray]:
        """Host ns (prepare) per iteration, and [n] device ns (forward) of n iterations of `seqs` sequences, `tokens`
        tokens and `context` context tokens each ([n] each): `forward_ns`'s arithmetic on arrays."""
        return int(self.cost.host_ns), self.cost._ns(seqs, tokens, context).astype(np.int64)

    def decode_tokens(self, batch: Batch, steps: int) -> np.ndarray:
        """[steps, sampled] what `sample` gives in those iterations (the same rows sample in each)."""
        return _tokens(batch.sampled_ids, batch.num_generated[batch.sample] + np.arange(steps, dtype=np.int64)[:, None])

    def swap(self, plan: SwapPlan) -> None:
        self.clock.advance(self._swap_ns(plan))

    def _swap_ns(self, plan: SwapPlan) -> int:
        return int(self.cost.per_swap_block_ns * (len(plan.swap_out) + len(plan.swap_in)))

    def release(self, request_id: int) -> None:
        pass
