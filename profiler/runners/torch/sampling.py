"""Per-request token sampling: greedy, or temperature / top-k / top-p with the request's own generator."""
from __future__ import annotations

import torch
from torch import Tensor

from itertrace.profiler.scheduling.batch import SamplingParams


def filter_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Temperature-scaled logits with tokens outside the top-k and the top-p nucleus set to -inf."""
    # logits: [vocab] float32
    if params.temperature <= 0:
        raise ValueError(f"temperature must be > 0 to sample, got {params.temperature}")
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth_largest = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each token
        drop = mass_before >= params.top_p
        drop[0] = False  # the most likely token always stays
        logits = logits.scatter(0, order[drop], float("-inf"))
    return logits


class Sampler:
    """Turns logits into tokens; a sampled request draws from its own generator, kept until `release`.

    Every row is sampled on the CPU in float32 with only its own request's state, so a request's tokens
    do not depend on which other requests share its batch (nor on any device RNG).
    """

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}

    def sample(self, request_ids: list[int], params: list[SamplingParams], logits: Tensor) -> list[int]:
        """One token per row of `logits`, in row order."""
        # logits: [S, vocab]
        logits = logits.detach().to("cpu", torch.float32)
        greedy = logits.argmax(-1).tolist()  # [S]
        tokens = []
        for row, (request_id, p) in enumerate(zip(request_ids, params)):
            if p.temperature == 0.0:
                tokens.append(greedy[row])
                continue
            probs = filter_logits(logits[row], p).softmax(-1)  # [vocab]
            tokens.append(int(torch.multinomial(probs, 1, generator=self._generator(request_id, p.seed))))
        return tokens

    def release(self, request_id: int) -> None:
        """Forget a finished request's generator (no-op for a request that never sampled)."""
        self._generators.pop(request_id, None)

    def _generator(self, request_id: int, seed: int) -> torch.Generator:
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator().manual_seed(seed)
        return self._generators[request_id]

    def __len__(self) -> int:
        return len(self._generators)
