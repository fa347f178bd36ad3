"""The torch runner inside the engine loop: determinism, stop tokens, and KV preemption that loses nothing."""
from __future__ import annotations

from dataclasses import replace

import pytest

from itertrace.profiler.scheduling.request import Phase, PreemptKind
from itertrace.profiler.scheduling.scheduler import Mode, SchedulerConfig
from itertrace.profiler.session import ModelSpec, RunSpec, run
from itertrace.profiler.workloads import RequestSpec, build_requests

TINY = ModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
SPECS = [RequestSpec(0, 5 + 3 * i, 6 + 2 * i) for i in range(6)]


def _outputs(spec: RunSpec, specs=SPECS, **kw):
    reqs = build_requests(specs, seed=7, **kw)
    res = run(spec, reqs)
    return reqs, res


def _spec(**sched) -> RunSpec:
    return RunSpec(scheduler=SchedulerConfig(**sched), runner="torch", model=TINY, num_blocks=256, block_size=4)


def test_same_seed_gives_same_tokens_and_text():
    a, _ = _outputs(_spec(max_num_seqs=4))
    b, _ = _outputs(_spec(max_num_seqs=4))
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert all(len(r.output_ids) == r.sampling.max_tokens for r in a)


def test_batch_composition_does_not_change_greedy_tokens():
    static, _ = _outputs(_spec(mode=Mode.STATIC, max_num_seqs=2))
    continuous, _ = _outputs(_spec(mode=Mode.CONTINUOUS, max_num_seqs=6, max_num_batched_tokens=8))
    assert [r.output_ids for r in static] == [r.output_ids for r in continuous]


@pytest.mark.parametrize("kind", [PreemptKind.RECOMPUTE, PreemptKind.SWAP])
def test_preemption_under_kv_pressure_gives_the_same_tokens(kind):
    roomy, _ = _outputs(_spec(max_num_seqs=6))
    # 12 blocks of 4 tokens cannot hold six requests of up to 36 tokens: preemptions must happen
    tight = replace(_spec(max_num_seqs=6, preemption=kind), num_blocks=12, swap_blocks=24)
    squeezed, _ = _outputs(tight)
    assert sum(r.num_preemptions for r in squeezed) > 0
    assert [r.output_ids for r in squeezed] == [r.output_ids for r in roomy]


def test_sampled_requests_are_reproducible_and_stop_on_a_stop_token():
    from itertrace.profiler.scheduling.batch import SamplingParams

    sampling = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    a, _ = _outputs(_spec(max_num_seqs=4), sampling=sampling)
    b, _ = _outputs(_spec(max_num_seqs=2), sampling=sampling)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    # stop at the third token the model would have produced
    probe = a[0].output_ids
    stop = probe[2]
    first = probe.index(stop)
    stopped = build_requests(SPECS[:1], seed=7, sampling=replace(sampling, stop_token_ids=(stop,)),
                             ignore_eos=False)
    run(_spec(max_num_seqs=4), stopped)
    assert stopped[0].phase is Phase.FINISHED_STOP and stopped[0].output_ids == probe[: first + 1]


def test_iteration_phases_are_timed_on_the_wall_clock(tmp_path):
    import pyarrow.parquet as pq

    reqs = build_requests(SPECS[:3], seed=1)
    run(_spec(max_num_seqs=4), reqs, run_dir=tmp_path)
    rows = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    phases = ("schedule_ns", "prepare_ns", "forward_ns", "sample_ns", "detokenize_ns", "postprocess_ns")
    for row in rows:
        assert row["forward_ns"] > 0 and not row["simulated"]
        assert sum(row[p] for p in phases) == row["dur_ns"] == row["end_ns"] - row["start_ns"]
    for a, b in zip(rows, rows[1:]):
        assert a["end_ns"] <= b["start_ns"]
    texts = pq.read_table(tmp_path / "requests.parquet").column("text").to_pylist()
    assert all(isinstance(t, str) for t in texts)
