"""The torch runner against a dense reference, plus sampling determinism and KV swapping."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from itertrace.profiler.scheduling.batch import Batch, SamplingParams, SeqWork, SwapPlan
from itertrace.profiler.runners.torch.model import ModelConfig
from itertrace.profiler.runners.torch.sampling import Sampler, filter_logits
from itertrace.profiler.runners.torch.scripted_decode import ScriptedDecode
from itertrace.profiler.runners.torch.torch_runner import TorchRunner

BLOCK = 4
SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, intermediate_size=96)
SMALL_GQA = ModelConfig(hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=2, intermediate_size=96)
GREEDY = SamplingParams()


def dense_logits(runner: TorchRunner, token_ids: list[int]) -> torch.Tensor:
    """Logits at every position from a plain full-sequence causal forward in float64, no cache."""
    c = runner.config
    w = {name: p.detach().double().cpu() for name, p in runner.model.named_parameters()}
    n, hd, group = len(token_ids), c.head_dim, c.num_heads // c.num_kv_heads

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    def rope(x: torch.Tensor) -> torch.Tensor:  # x: [n, heads, hd]; pairs (i, i + hd/2) rotate by pos * theta^(-2i/hd)
        half = hd // 2
        angle = torch.arange(n, dtype=torch.float64)[:, None] * c.rope_theta ** (-torch.arange(half) * 2.0 / hd)
        cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    x = w["embed_tokens.weight"][torch.tensor(token_ids)]  # [n, H]
    future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    for i in range(c.num_layers):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(n, c.num_heads, hd))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(n, c.num_kv_heads, hd))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, c.num_kv_heads, hd)
        heads = []
        for head in range(c.num_heads):
            scores = q[:, head] @ k[:, head // group].T / math.sqrt(hd)  # [n, n]
            heads.append(scores.masked_fill(future, -math.inf).softmax(-1) @ v[:, head // group])
        x = x + torch.cat(heads, dim=-1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head_weight = w["embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    return rms(x, w["norm.weight"]) @ head_weight.T  # [n, vocab]


def work(rid: int, tokens: list[int], start: int, table: list[int], sample: bool = True,
         params: SamplingParams = GREEDY, generated: int = 0) -> SeqWork:
    return SeqWork(rid, tuple(tokens), start, tuple(table), sample, params, generated)


def step(runner: TorchRunner, iteration: int, seqs: list[SeqWork]) -> torch.Tensor:
    return runner.forward(runner.prepare(Batch.from_seqs(iteration, tuple(seqs), BLOCK)))


@pytest.mark.parametrize("config", [SMALL, SMALL_GQA, ModelConfig(tie_word_embeddings=True)],
                         ids=["mha", "gqa", "default-size-tied"])
def test_chunked_prefill_and_decode_in_shuffled_blocks_match_dense_reference(config: ModelConfig) -> None:
    runner = TorchRunner(config, num_blocks=40, block_size=BLOCK, seed=3)
    rng = random.Random(0)
    blocks = list(range(40))
    rng.shuffle(blocks)
    a_table, b_table = blocks[:8], blocks[8:13]  # non-contiguous, in no particular order
    a = [rng.randrange(256) for _ in range(28)]  # prompt 23 in three chunks, then 5 decodes
    b = [rng.randrange(256) for _ in range(18)]  # prompt 11 in one chunk, then 7 decodes
    got_a, got_b = {}, {}  # position -> logits row

    # A's first chunk samples nothing, so the only row is B's; later iterations mix orders.
    logits = step(runner, 0, [work(1, a[0:7], 0, a_table, sample=False), work(2, b[0:11], 0, b_table)])
    assert logits.shape == (1, config.vocab_size)
    got_b[10] = logits[0]
    logits = step(runner, 1, [work(2, b[11:12], 11, b_table), work(1, a[7:16], 7, a_table)])
    got_b[11], got_a[15] = logits
    logits = step(runner, 2, [work(1, a[16:23], 16, a_table), work(2, b[12:13], 12, b_table)])
    got_a[22], got_b[12] = logits
    for it, pos in enumerate(range(23, 28), start=3):
        got_a[pos], got_b[pos - 10] = step(runner, it, [work(1, a[pos:pos + 1], pos, a_table),
                                                         work(2, b[pos - 10:pos - 9], pos - 10, b_table)])

    for tokens, got in ((a, got_a), (b, got_b)):
        want = dense_logits(runner, tokens)
        for pos, row in got.items():
            torch.testing.assert_close(row.double().cpu(), want[pos], rtol=1e-4, atol=1e-5)
    assert got_a[27].abs().max() > 1e-3  # the comparison is not between two near-zero vectors


def test_decode_batch_pads_block_tables_of_different_lengths() -> None:
    runner = TorchRunner(SMALL_GQA, num_blocks=32, block_size=BLOCK, seed=1)
    seqs = {1: ([5, 9, 2], list(range(3, 12))), 2: ([20, 30, 10, 0, 7, 6], list(range(40, 61))), 3: ([31], [99])}
    for rid, (table, tokens) in seqs.items():
        if len(tokens) > 1:
            step(runner, 0, [work(rid, tokens[:-1], 0, table, sample=False)])
    rows = step(runner, 1, [work(rid, tokens[-1:], len(tokens) - 1, table) for rid, (table, tokens) in seqs.items()])
    for row, (_, tokens) in zip(rows, seqs.values()):
        torch.testing.assert_close(row.double().cpu(), dense_logits(runner, tokens)[-1], rtol=1e-4, atol=1e-5)


Prompts = dict[int, tuple[list[int], SamplingParams]]


def generate(runner: TorchRunner, prompts: Prompts, steps: int) -> dict[int, list[int]]:
    """A minimal engine loop: every request prefills in iteration 0, then all decode together."""
    tables = {rid: list(range(8 * i, 8 * i + 8)) for i, rid in enumerate(prompts)}
    out: dict[int, list[int]] = {rid: [] for rid in prompts}
    seqs = [work(rid, prompt, 0, tables[rid], params=p) for rid, (prompt, p) in prompts.items()]
    for it in range(steps):
        batch = Batch.from_seqs(it, tuple(seqs), BLOCK)
        tokens = dict(zip(batch.request_ids[batch.sample].tolist(),
                          runner.sample(batch, runner.forward(runner.prepare(batch))).tolist()))
        for rid, token in tokens.items():
            out[rid].append(token)
        seqs = [work(s.request_id, [tokens[s.request_id]], s.context_len, tables[s.request_id], params=s.sampling,
                     generated=len(out[s.request_id])) for s in seqs]
    return out


HOT = SamplingParams(temperature=1.5, seed=7)
PROMPTS = {
    10: ([1, 2, 3, 4, 5, 6], GREEDY),
    11: ([9, 8, 7], HOT),
    12: ([100, 101, 102, 103, 104, 105, 106, 107, 108], SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3)),
}


def test_same_seed_gives_same_tokens_across_fresh_runners() -> None:
    first = generate(TorchRunner(SMALL, num_blocks=32, block_size=BLOCK, seed=5), PROMPTS, 12)
    second = generate(TorchRunner(SMALL, num_blocks=32, block_size=BLOCK, seed=5), PROMPTS, 12)
    assert first == second
    other_weights = generate(TorchRunner(SMALL, num_blocks=32, block_size=BLOCK, seed=6), PROMPTS, 12)
    assert other_weights != first


def test_sampled_request_is_independent_of_its_batch_mates() -> None:
    runner = TorchRunner(SMALL, num_blocks=32, block_size=BLOCK, seed=5)
    batched = generate(runner, PROMPTS, 12)
    for rid in (11, 12):
        runner.release(rid)
    alone = generate(runner, {11: PROMPTS[11]}, 12)
    assert alone[11] == batched[11]
    greedy_same_prompt = generate(runner, {13: (PROMPTS[11][0], GREEDY)}, 12)
    assert greedy_same_prompt[13] != batched[11]  # temperature 1.5 really samples


def test_generator_survives_across_iterations_until_release() -> None:
    sampler = Sampler()
    logits = torch.zeros(1, 50)
    draws = [sampler.sample([4], [HOT], logits)[0] for _ in range(20)]
    assert len(set(draws)) > 5  # the generator advances; it is not re-seeded each iteration
    sampler.release(4)
    assert len(sampler) == 0
    assert [sampler.sample([4], [HOT], logits)[0] for _ in range(20)] == draws


def test_top_k_one_and_tiny_top_p_equal_greedy() -> None:
    logits = torch.randn(64, 260, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(-1).tolist()
    sampler = Sampler()
    ids = list(range(64))
    assert sampler.sample(ids, [SamplingParams(temperature=2.0, top_k=1, seed=i) for i in ids], logits) == greedy
    assert sampler.sample(ids, [SamplingParams(temperature=2.0, top_p=1e-6, seed=i) for i in ids], logits) == greedy
    assert sampler.sample(ids, [GREEDY] * 64, logits) == greedy


def test_filters_keep_exactly_the_top_k_and_the_nucleus() -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = lambda p: (filter_logits(logits, p) > -math.inf).tolist()  # noqa: E731
    assert kept(SamplingParams(temperature=1.0, top_k=2)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.7)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.85)) == [True, True, True, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.4)) == [True, False, False, False]
    assert kept(SamplingParams(temperature=1.0)) == [True] * 4
    torch.testing.assert_close(filter_logits(logits, SamplingParams(temperature=2.0)), logits / 2)


def test_temperature_draws_follow_the_softened_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=2.0, seed=11)
    sampler = Sampler()
    draws = [sampler.sample([0], [params], logits)[0] for _ in range(4000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4).double() / len(draws)
    torch.testing.assert_close(freq, (logits[0].double() / 2).softmax(-1), atol=0.03, rtol=0)
    again = Sampler()
    assert [again.sample([0], [params], logits)[0] for _ in range(4000)] == draws


def test_swapped_out_and_back_into_other_blocks_decodes_identically() -> None:
    tokens = [random.Random(2).randrange(256) for _ in range(30)]

    def run(swap: bool) -> list[torch.Tensor]:
        runner = TorchRunner(SMALL_GQA, num_blocks=24, block_size=BLOCK, swap_blocks=8, seed=4)
        table = [3, 17, 8, 1, 12, 5, 20, 9]
        step(runner, 0, [work(1, tokens[:13], 0, table[:4])])
        rows = []
        for pos in range(13, 30):
            if swap and pos == 20:  # preempt by swapping, trash the blocks, resume elsewhere
                used = table[:5]
                runner.swap(SwapPlan(swap_out=[(b, s) for b, s in zip(used, [6, 0, 7, 2, 4])]))
                runner.kv_cache[:, :, used] = torch.randn_like(runner.kv_cache[:, :, used])
                table = [22, 0, 14, 6, 2, 19, 11, 23]
                runner.swap(SwapPlan(swap_in=[(s, b) for s, b in zip([6, 0, 7, 2, 4], table[:5])]))
            rows.append(step(runner, pos, [work(1, tokens[pos:pos + 1], pos, table)])[0])
        return rows

    for plain, swapped in zip(run(False), run(True)):
        assert torch.equal(plain, swapped)


def test_swap_plan_reads_every_source_before_writing() -> None:
    runner = TorchRunner(SMALL, num_blocks=4, block_size=BLOCK, swap_blocks=2)
    runner.kv_cache[:, :, 1] = 1.0
    runner.swap_pool[:, :, 0] = 2.0
    runner.swap(SwapPlan(swap_out=[(1, 0)], swap_in=[(0, 1)]))  # exchange block 1 and slot 0
    assert bool((runner.kv_cache[:, :, 1] == 2.0).all()) and bool((runner.swap_pool[:, :, 0] == 1.0).all())
    with pytest.raises(ValueError, match="swap pair"):
        runner.swap(SwapPlan(swap_out=[(1, 2)]))


def test_rejects_a_block_table_too_short_for_the_context() -> None:
    runner = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK)
    with pytest.raises(ValueError, match="cannot hold"):
        runner.prepare(Batch.from_seqs(0, (work(1, list(range(9)), 0, [0, 1]),), BLOCK))


def test_runner_attributes() -> None:
    runner = TorchRunner(SMALL, num_blocks=8, block_size=BLOCK)
    assert (runner.name, runner.simulated, runner.vocab_size) == ("torch", False, 260)
    assert runner.device == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert runner.layer_caches[0][0].shape == (8, BLOCK, SMALL.num_kv_heads, SMALL.head_dim)
    assert runner.forward(runner.prepare(Batch.from_seqs(0, (), BLOCK))).shape == (0, 260)


def test_a_torch_run_reports_progress_after_every_iteration() -> None:
    """A model's iterations are slow enough that the progress line (printed at most every 2 s) must be
    offered one after each; simulated runs offer it at every thousandth (test_bulk)."""
    from itertrace.profiler.session import ModelSpec, RunSpec, run
    from itertrace.profiler.workloads import RequestSpec, build_requests

    spec = RunSpec(runner="torch", num_blocks=16, block_size=BLOCK, model=ModelSpec(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=48, device="cpu"))
    calls = []
    result = run(spec, build_requests([RequestSpec(0, 5, 7), RequestSpec(0, 3, 4)]),
                 progress=lambda iteration, arrived: calls.append((iteration, arrived)))
    assert calls == [(i, 2) for i in range(1, result.iterations + 1)] and result.iterations == 7


def decode_batch(iteration: int, tokens: list[int], pos: list[int], tables: np.ndarray, *, block_size: int = BLOCK,
                 sample: np.ndarray | None = None, ones: np.ndarray | None = None) -> Batch:
    """A decode batch; pass the same arrays again to share them between iterations, as the scheduler does."""
    n = len(tokens)
    return Batch(iteration=iteration, block_size=block_size, request_ids=np.arange(n),
                 start_pos=np.array(pos, dtype=np.int64),
                 num_tokens=np.ones(n, dtype=np.int64) if ones is None else ones,
                 token_ids=np.array(tokens, dtype=np.int64),
                 sample=np.ones(n, dtype=bool) if sample is None else sample,
                 block_tables=tables, num_generated=np.zeros(n, dtype=np.int64), sampling=(GREEDY,) * n)


@pytest.mark.parametrize("in_place", [True, False], ids=["grown-in-place", "new-tables"])
@pytest.mark.parametrize("block_size", [4, 3], ids=["power-of-two", "other"])
def test_decode_fast_path_gives_the_logits_of_the_general_path(block_size: int, in_place: bool) -> None:
    """Steady decodes with the scheduler's sharing of arrays (tables kept while rows take blocks in place, or
    new tables at each change; a sample mask with a row that does not sample) give bit-identical logits to
    the general path, which clamps padding."""
    fast, general = (TorchRunner(SMALL_GQA, num_blocks=64, block_size=block_size, seed=2) for _ in range(2))
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(k)] for k in (5, 1, 12, 8)]
    blocks = list(range(64))
    rng.shuffle(blocks)
    owned = [blocks[16 * i: 16 * i + 16] for i in range(len(prompts))]  # each row's blocks, in order
    held = [-(-len(p) // block_size) for p in prompts]
    width = 12  # wider than any context needs: the runner passes on only the columns in use

    def table() -> np.ndarray:
        out = np.full((len(prompts), width), -1, dtype=np.int64)
        for i, k in enumerate(held):
            out[i, :k] = owned[i][:k]
        return out

    seqs = [work(i, p, 0, owned[i][:held[i]]) for i, p in enumerate(prompts)]
    prefill = Batch.from_seqs(0, tuple(seqs), block_size)
    logits = fast.forward(fast.prepare(prefill))
    assert torch.equal(logits, general.forward(general.prepare(prefill)))
    tokens = logits.argmax(-1).tolist()
    pos = [len(p) for p in prompts]
    tables, ones = table(), np.ones(len(prompts), dtype=np.int64)
    sample = np.array([True, True, False, True])  # row 2 runs a token without sampling (as a 1-token chunk would)
    reused = 0
    for it in range(1, 3 * block_size + 4):
        grow = [i for i in range(len(pos)) if pos[i] >= held[i] * block_size]
        for i in grow:
            if in_place:  # the block goes into the -1 entry of the same array, as DecodeRows.grow does
                tables[i, held[i]] = owned[i][held[i]]
            held[i] += 1
        if grow and not in_place:  # a new tables array, as DecodeRows makes when rows join or leave
            tables = table()
        batch = decode_batch(it, tokens, pos, tables, block_size=block_size, sample=sample, ones=ones)
        prepared = fast.prepare(batch)
        reused += prepared.meta.decode_block_tables.shape[1] < width  # passed on only as wide as needed
        got = fast.forward(prepared)
        assert torch.equal(got, general.forward(general._prepare_mixed(batch))), it
        by_row = iter(got.argmax(-1).tolist())
        tokens = [next(by_row) if s else t + 1 for s, t in zip(sample.tolist(), tokens)]
        pos = [p + 1 for p in pos]
    assert reused


def test_decode_padding_past_each_context_is_never_read() -> None:
    runner = TorchRunner(SMALL, num_blocks=16, block_size=BLOCK, seed=4)
    seqs = [work(1, list(range(10, 19)), 0, [7, 2, 9]), work(2, [40, 41], 0, [5])]
    runner.forward(runner.prepare(Batch.from_seqs(0, tuple(seqs), BLOCK)))
    tables = np.array([[7, 2, 9, -1], [5, -1, -1, -1]])  # -1 padding, and a column no context reaches
    padded = runner.prepare(decode_batch(1, [19, 42], [9, 2], tables))
    assert padded.meta.decode_block_tables.tolist() == [[7, 2, 9], [5, -1, -1]]
    first = runner.forward(padded)
    unused = [b for b in range(16) if b not in (7, 2, 9, 5)]
    runner.kv_cache[:, :, unused] = float("nan")  # only the contexts' own blocks are read
    again = runner.forward(runner.prepare(decode_batch(1, [19, 42], [9, 2], tables.copy())))
    assert torch.equal(first, again)


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
def test_decode_fast_path_reads_blocks_written_into_the_same_tables(contiguous: bool) -> None:
    """As Batch allows (and the scheduler's decode rows do), a row's next block goes into its -1 entry of the
    tables array already prepared: the next prepare of that array writes the token into the new block, and
    refuses a block id outside the cache. A strided array, which the runner copies, is read again each time."""
    runner = TorchRunner(SMALL, num_blocks=16, block_size=BLOCK, seed=4)
    store = np.full((2, 8), -1, dtype=np.int64)
    tables = store if contiguous else store[:, ::2]
    tables[0, 0], tables[1, 0] = 7, 5
    first = runner.prepare(decode_batch(1, [19, 42], [3, 2], tables))
    assert first.meta.slot_mapping.tolist() == [7 * BLOCK + 3, 5 * BLOCK + 2]
    runner.forward(first)
    tables[0, 1] = 11  # row 0's next token, at position 4, starts its second block
    second = runner.prepare(decode_batch(2, [20, 43], [4, 3], tables))
    assert second.meta.slot_mapping.tolist() == [11 * BLOCK, 5 * BLOCK + 3]
    assert second.meta.decode_block_tables.tolist() == [[7, 11], [5, -1]]
    assert runner.forward(second).shape == (2, SMALL.vocab_size)
    tables[1, 1] = 16  # row 1's next block, outside the cache
    with pytest.raises(ValueError, match="block id outside"):
        runner.prepare(decode_batch(3, [21, 44], [5, 4], tables))


SHORT = ModelConfig(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=4, intermediate_size=96, max_position=12)


@pytest.mark.parametrize("tokens, pos, table, message", [
    ([3, 260], [4, 5], [[0, 1, -1], [2, 3, -1]], "token id outside"),
    ([3, 4], [4, 12], [[0, 1, -1], [2, 3, 4]], "request 1: context 13 > max_position 12"),
    ([3, 4], [4, 8], [[0, 1, -1], [2, 3, -1]], "request 1: 2 blocks cannot hold 9 tokens"),  # -1 where it goes
    ([3, 4], [4, 8], [[0, 1], [2, 3]], "request 1: 2 blocks cannot hold 9 tokens"),  # past the table's end
    ([3, 4], [4, 5], [[0, 1, -1], [2, 8, -1]], "block id outside"),  # where a token goes
    ([3, 4], [4, 1], [[0, 1, -1], [2, -1, 9]], "block id outside"),  # in a column no context reaches
], ids=["token-high", "max-position", "short-table", "narrow-table", "block", "unused-block"])
def test_decode_batches_are_refused_as_check_refuses_them(tokens, pos, table, message) -> None:
    runner = TorchRunner(SHORT, num_blocks=8, block_size=BLOCK)
    tables = np.array([[0, 1, -1], [2, 3, -1]])
    ones = np.ones(2, dtype=np.int64)
    runner.prepare(decode_batch(0, [3, 4], [4, 5], tables, ones=ones))  # a good batch first: its arrays are cached
    same = np.array(table)
    if np.array_equal(same, tables):
        same = tables  # the cached tables array itself, now with positions it cannot serve
    with pytest.raises(ValueError, match=message):
        runner.prepare(decode_batch(1, tokens, pos, same, ones=ones))
    with pytest.raises(ValueError, match=message):  # and the same from a fresh runner
        TorchRunner(SHORT, num_blocks=8, block_size=BLOCK).prepare(decode_batch(1, tokens, pos, np.array(table)))


def test_the_seed_picks_the_token_stream() -> None:
    """At temperature 1 over 256 equally likely tokens, 32 draws: the same seed gives the same stream under any
    request id, another seed another stream (equal by chance with probability 256**-32). A generator that
    ignored the seed would give every request the same stream."""
    logits = torch.zeros(1, 256)

    def stream(request_id: int, seed: int) -> list[int]:
        sampler = Sampler()
        params = SamplingParams(temperature=1.0, seed=seed)
        return [sampler.sample([request_id], [params], logits)[0] for _ in range(32)]

    assert stream(0, seed=1) == stream(5, seed=1)
    assert stream(0, seed=1) != stream(0, seed=2)
    assert len({tuple(stream(0, seed)) for seed in range(4)}) == 4


@pytest.mark.parametrize("config", [SMALL, SMALL_GQA], ids=["mha", "gqa"])
def test_scripted_decode_gives_the_eager_logits(config: ModelConfig) -> None:
    """The all-decode forward pass runs as one TorchScript call (without the GIL): bit for bit the logits of
    the model's eager forward over the same inputs and cache."""
    runner = TorchRunner(config, num_blocks=32, block_size=BLOCK, seed=5)
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(k)] for k in (9, 3, 14)]
    tables = [[3, 8, 1, 20], [5], [30, 2, 11, 17]]
    runner.forward(runner.prepare(Batch.from_seqs(0, tuple(work(i, p, 0, t) for i, (p, t) in
                                                        enumerate(zip(prompts, tables))), BLOCK)))
    batch = decode_batch(1, [7, 70, 200], [len(p) for p in prompts],
                         np.array([t + [-1] * (4 - len(t)) for t in tables]), block_size=BLOCK)
    prepared = runner.prepare(batch)
    assert ScriptedDecode.handles(prepared.meta, runner.device)
    scripted = runner._scripted(prepared.input_ids, prepared.positions, runner.layer_caches, prepared.meta,
                                prepared.sample_rows)
    with torch.inference_mode():
        hidden = runner.model(prepared.input_ids, prepared.positions, runner.layer_caches, prepared.meta)
        eager = runner.model.compute_logits(hidden[prepared.sample_rows])
    assert torch.equal(scripted, eager)
