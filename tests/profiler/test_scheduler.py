"""Exact checks of the worked example and slot-time claims, on the simulated runner."""
from __future__ import annotations

from collections import Counter, deque

import numpy as np
import pyarrow.parquet as pq
import pytest

from itertrace.profiler import experiments
from itertrace.profiler.scheduling.batch import SwapPlan
from itertrace.profiler.scheduling.budget import Budget
from itertrace.profiler.clock import SimClock
from itertrace.profiler.engine import Engine
from itertrace.profiler.scheduling.kv import BlockManager, BlockPool, OutOfBlocks
from itertrace.profiler.scheduling.policies import Policy, sort_key
from itertrace.profiler.scheduling.preemption import victim
from itertrace.profiler.scheduling.request import Phase, PreemptKind, Reason, Transition
from itertrace.profiler.scheduling.scheduler import Limit, Mode, Scheduler, SchedulerConfig
from itertrace.profiler.session import RunSpec, run
from itertrace.profiler.runners.sim_runner import SimulatedRunner
from itertrace.profiler.workloads import RequestSpec, build_requests, slot_time, worked_example


def _run(mode: Mode, specs, capacity: int = 8, run_dir=None, **sched):
    spec = RunSpec(scheduler=SchedulerConfig(mode=mode, max_num_seqs=capacity, **sched))
    reqs = build_requests(specs)
    res = run(spec, reqs, run_dir=run_dir, keep_membership=True)
    return reqs, res


def _finish_iteration(req) -> int:
    return next(t.iteration for t in req.transitions if t.dst.terminal)


def test_worked_example_static_keeps_finished_ids_for_480_iterations(tmp_path):
    reqs, res = _run(Mode.STATIC, worked_example(), run_dir=tmp_path)
    assert [_finish_iteration(r) for r in reqs[:8]] == [31] * 7 + [511]
    # the seven finished ids stay in the batch table from iteration 32 through 511
    log = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    held = [row["iteration"] for row in log if sorted(row["finished_member_ids"]) == list(range(7))]
    assert held == list(range(32, 512))
    assert all(row["member_ids"] == list(range(8)) for row in log[:512])
    assert all(row["slots_finished"] == 7 and row["num_seqs"] == 1 for row in log[32:512])
    # waiting requests start only when the long request is done
    assert [r.first_scheduled_iteration for r in reqs[8:]] == [512] * 8
    assert res.idle_finished == 7 * 480


def test_worked_example_continuous_frees_slots_at_finish_iteration():
    reqs, res = _run(Mode.CONTINUOUS, worked_example())
    assert [_finish_iteration(r) for r in reqs[:8]] == [31] * 7 + [511]
    for r in reqs[:7]:
        assert r.request_id in res.membership[31]
        assert r.request_id not in res.membership[32]
    assert sorted(res.membership[32]) == list(range(7, 15))
    # seven waiting requests take the freed slots at iteration 32; the eighth gets the next free one at 64
    assert [r.first_scheduled_iteration for r in reqs[8:]] == [32] * 7 + [64]
    assert res.idle_finished == 0


def test_continuous_starts_waiting_requests_earlier_than_static():
    static_reqs, static_res = _run(Mode.STATIC, worked_example())
    cont_reqs, cont_res = _run(Mode.CONTINUOUS, worked_example())
    for s, c in zip(static_reqs[8:], cont_reqs[8:]):
        assert cont_res.times[c.request_id].first_token_ns < static_res.times[s.request_id].first_token_ns


@pytest.mark.parametrize("mode", [Mode.STATIC, Mode.CONTINUOUS])
def test_uniform_lengths_leave_no_idle_slot_while_queue_nonempty(mode, tmp_path):
    reqs, res = _run(mode, slot_time("uniform", 160), capacity=16, run_dir=tmp_path)
    log = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    queued = [row for row in log if row["num_waiting"] > 0]
    assert len(queued) == 128 * 9  # ten batches of 16; the queue empties when the tenth starts
    assert all(row["num_seqs"] == 16 for row in queued)
    assert res.idle_while_queued == 0 and res.idle_slot_iterations == 0


def test_static_membership_is_unchanged_within_a_batch(tmp_path):
    _run(Mode.STATIC, slot_time("variable", 64), capacity=16, run_dir=tmp_path)
    log = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    batches = []
    for row in log:
        if not batches or row["admitted"]:
            batches.append(row["member_ids"])
        assert row["member_ids"] == batches[-1]
    assert len(batches) == 4 and sorted(sum(batches, [])) == list(range(64))


def test_static_idle_matches_prediction_from_lengths():
    specs = slot_time("variable", 160, seed=3)
    _, res = _run(Mode.STATIC, specs, capacity=16)
    assert res.idle_slot_iterations == experiments.static_idle_prediction([s.output_tokens for s in specs], 16)


def test_variable_workload_has_mean_128_like_uniform_at_every_size():
    for n in (*range(1, 70), 100, 4000):
        lengths = [s.output_tokens for s in slot_time("variable", n)]
        assert len(lengths) == n and sum(lengths) == 128 * n, n
    counts = Counter(s.output_tokens for s in slot_time("variable", 4000))  # the stated probabilities, exactly
    assert counts == {8: 800, 16: 800, 32: 600, 64: 600, 128: 600, 256: 200, 512: 200, 1024: 200}
    counts = Counter(s.output_tokens for s in slot_time("variable", 48))  # two blocks of 20, 8 more at 128
    assert counts == {8: 8, 16: 8, 32: 6, 64: 6, 128: 6 + 8, 256: 2, 512: 2, 1024: 2}


def test_chunked_prefill_splits_a_long_prompt_under_the_token_budget(tmp_path):
    reqs, _ = _run(Mode.CONTINUOUS, [RequestSpec(0, 100, 4)], capacity=4, run_dir=tmp_path, max_num_batched_tokens=32)
    log = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    assert [row["prefill_tokens"] for row in log[:4]] == [32, 32, 32, 4]
    assert [row["decode_tokens"] for row in log] == [0, 0, 0, 0, 1, 1, 1]
    assert len(reqs[0].output_ids) == 4


def test_no_chunked_prefill_rejects_prompt_over_budget():
    reqs, _ = _run(Mode.CONTINUOUS, [RequestSpec(0, 100, 4), RequestSpec(0, 10, 4)], capacity=4,
                   max_num_batched_tokens=32, chunked_prefill=False)
    assert reqs[0].phase is Phase.REJECTED and reqs[0].stop_reason is Reason.TOO_LONG
    assert reqs[1].phase is Phase.FINISHED_LENGTH


def test_decode_reserve_holds_back_prefill(tmp_path):
    # 3 decoding requests, then a 64-token prompt arrives; half of a 32-token budget is reserved for decode
    specs = [RequestSpec(0, 4, 40)] * 3 + [RequestSpec(1, 64, 2)]
    spec = RunSpec(scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, decode_reserve=0.5))
    run(spec, build_requests(specs), run_dir=tmp_path)
    log = pq.read_table(tmp_path / "iterations.parquet").to_pylist()
    late = [row for row in log if row["iteration"] >= 1 and row["prefill_tokens"]]
    assert all(row["prefill_tokens"] <= 32 - max(16, row["decode_tokens"]) for row in log)
    assert [row["prefill_tokens"] for row in late][:4] == [16, 16, 16, 16]


def test_recompute_preemption_frees_blocks_and_reruns_the_prefix():
    # 4 blocks of 4 tokens = 16 token slots; two requests of 4 + 10 tokens cannot both fit
    blocks = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64), blocks)
    reqs = build_requests([RequestSpec(0, 4, 10), RequestSpec(0, 4, 10)])
    for r in reqs:
        sched.add(r, 0)
    it, preempted_at = 0, None
    while sched.has_work():
        d = sched.schedule(it)
        if d.preempted and preempted_at is None:
            preempted_at = it
        sched.postprocess(d, np.full(int(d.batch.sample.sum()), 65), it)
        it += 1
    victim = reqs[1]  # FCFS: the later arrival is the victim
    assert preempted_at is not None and victim.num_preemptions >= 1 and reqs[0].num_preemptions == 0
    assert [t.reason for t in victim.transitions if t.dst is Phase.PREEMPTED][0] is Reason.KV_EXHAUSTED
    assert all(r.phase is Phase.FINISHED_LENGTH and len(r.output_ids) == 10 for r in reqs)
    assert blocks.device.num_free == 4


def _drive(sched, reqs, arrivals=None, max_iterations=200):
    """Schedule and postprocess until no work is left (at most `max_iterations`); `arrivals`: {iteration: requests}."""
    arrivals = arrivals if arrivals is not None else {0: reqs}
    decisions = []
    for it in range(max_iterations):
        for r in arrivals.get(it, []):
            sched.add(r, it)
        if not sched.has_work() and it >= max(arrivals):
            break
        d = sched.schedule(it)
        decisions.append(d)
        sched.postprocess(d, np.full(int(d.batch.sample.sum()), 65), it)
    return decisions


def test_preempting_iteration_admits_and_resumes_no_one():
    # Shortest remaining work first, 6 blocks of 4: requests preempt one another for blocks. The blocks
    # a preemption gave up are not handed to the queue (the victim itself included) in the same iteration.
    specs = [RequestSpec(10_000_000, 2, 8), RequestSpec(10_000_000, 3, 7), RequestSpec(0, 9, 4),
             RequestSpec(30_000_000, 8, 7)]
    cfg = SchedulerConfig(policy=Policy.SRW, max_num_seqs=3, max_num_batched_tokens=11, decode_reserve=0.75)
    reqs, clock, decisions = build_requests(specs), SimClock(), []
    sched = Scheduler(cfg, BlockManager(6, 4))
    Engine(sched, SimulatedRunner(clock), clock, on_iteration=lambda d, start, end: decisions.append(d)).run(reqs)
    preempting = [d for d in decisions if d.preempted]
    assert preempting
    assert all(d.limit is Limit.KV_BLOCKS and d.admitted == d.resumed == 0 for d in preempting)
    assert all(r.phase is Phase.FINISHED_LENGTH for r in reqs)


def test_a_recompute_is_chunked_even_with_chunked_prefill_off():
    # 4 + 4 tokens fit the 8-token budget at admission; after the preemption, the victim's prompt and
    # outputs are more than 8 tokens: it recomputes them in chunks, or it would never run again.
    blocks = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=8, chunked_prefill=False), blocks)
    reqs = build_requests([RequestSpec(0, 4, 10), RequestSpec(0, 4, 10)])
    decisions = _drive(sched, reqs)
    assert reqs[1].num_preemptions >= 1
    assert all(r.phase is Phase.FINISHED_LENGTH and len(r.output_ids) == 10 for r in reqs)
    assert all(d.batch.num_tokens_total <= 8 for d in decisions)
    assert blocks.device.num_free == 4


def test_a_swapped_out_request_resumes_only_when_its_blocks_fit():
    # The victim is swapped out; it comes back only once the device has room for every swapped block.
    blocks = BlockManager(num_blocks=4, block_size=4, swap_blocks=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, preemption=PreemptKind.SWAP), blocks)
    reqs = build_requests([RequestSpec(0, 4, 10), RequestSpec(0, 4, 10)])
    decisions = _drive(sched, reqs)
    assert sum(len(d.swap.swap_out) for d in decisions) > 0 and reqs[1].num_preemptions >= 1
    assert all(r.phase is Phase.FINISHED_LENGTH and len(r.output_ids) == 10 for r in reqs)
    assert blocks.device.num_free == 4 and blocks.swap.num_free == 4


def test_decode_reserve_holds_back_one_token_prompts_too():
    # A 4-token budget with 3 reserved for decodes: prefill gets 1 token an iteration, even for prompts of 1.
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=4, decode_reserve=0.75), BlockManager(16, 4))
    reqs = build_requests([RequestSpec(0, 1, 2), RequestSpec(0, 1, 2)])
    decisions = _drive(sched, reqs)
    assert [(d.prefill_tokens, d.decode_tokens) for d in decisions[:2]] == [(1, 0), (1, 1)]
    assert decisions[0].limit is Limit.DECODE_RESERVE
    assert [r.first_scheduled_iteration for r in reqs] == [0, 1]


def test_reject_mode_admits_the_next_request_after_refusing_one():
    # 8 blocks of 4. A is promised 6 blocks (4 + 20 tokens); at iteration 1, B (4 blocks) cannot be
    # promised and is rejected, and C (2 blocks), queued behind it, is admitted in that same iteration.
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, preemption=PreemptKind.REJECT),
                      BlockManager(8, 4))
    a, b, c = build_requests([RequestSpec(0, 4, 20), RequestSpec(1, 8, 8), RequestSpec(2, 4, 4)])
    decisions = _drive(sched, [a, b, c], arrivals={0: [a], 1: [b, c]})
    assert b.phase is Phase.REJECTED and b.stop_reason is Reason.NO_KV_FOR_ADMISSION
    assert (decisions[1].rejected, decisions[1].admitted) == (1, 1)
    assert c.first_scheduled_iteration == 1 and c.phase is Phase.FINISHED_LENGTH


def test_victim_is_the_lowest_ranked_unscheduled_member_holding_blocks():
    a, b, c, d = build_requests([RequestSpec(0, 8, 4)] * 4)  # live in policy order: a, b, c, d
    for i, r in enumerate((a, b, c, d)):
        r.move(Phase.PREFILL, Reason.ADMITTED, 0)
        r.block_ids = [i]
    d.block_ids = []  # holds nothing to give
    assert victim([a, b, c, d], [], a) is c
    assert victim([a, b, c, d], [(c, 4)], a) is b  # c is scheduled this iteration
    assert victim([a, b, c, d], [(b, 4), (c, 4)], a) is a  # no one else: the needy one yields


def test_edf_puts_requests_without_a_deadline_last():
    reqs = build_requests([RequestSpec(0, 4, 4), RequestSpec(1, 4, 4, deadline_ns=900),
                           RequestSpec(2, 4, 4, deadline_ns=500)])
    ranked = sorted(reqs, key=sort_key(Policy.EDF, 1))
    assert [r.request_id for r in ranked] == [reqs[2].request_id, reqs[1].request_id, reqs[0].request_id]


def test_block_pool_is_fifo_and_refuses_blocks_it_did_not_hand_out():
    pool = BlockPool(4)
    first = pool.take(1, 2)
    assert first == [0, 1]
    pool.give_back(1, first)  # freed blocks go to the back of the free list
    assert pool.take(2, 2) == [2, 3] and pool.take(3, 2) == [0, 1]
    pool.give_back(3, [0, 1])
    assert pool.num_free == 2 and pool.owners() == {2: 2, 3: 2}
    with pytest.raises(RuntimeError):
        pool.give_back(3, [0])  # given back twice
    with pytest.raises(RuntimeError):
        pool.give_back(1, [2])  # request 2's
    with pytest.raises(RuntimeError):
        pool.give_back(2, [2, 3, 0])  # 2 and 3 are request 2's, 0 is free: refused, and nothing changes
    assert pool.num_free == 2 and pool.owners() == {2: 2, 3: 2}
    pool.give_back(2, [2, 3])
    assert pool.num_free == 4 and pool.owners() == {}


def test_block_pool_hands_out_what_a_first_in_first_out_queue_would():
    """Thousands of takes and give-backs on a small pool (its free list drops its taken front many times),
    against a deque and a dict: the same blocks in the same order, the same owners, the same refusals."""
    rng = np.random.default_rng(5)
    pool, free, owners, held = BlockPool(50), deque(range(50)), {}, {}
    for step in range(4000):
        owner = int(rng.integers(0, 8))
        kind = rng.integers(0, 3)
        if kind == 0:
            count = int(rng.integers(0, 20))
            if count > len(free):
                with pytest.raises(OutOfBlocks):
                    pool.take(owner, count)
            else:
                expected = [free.popleft() for _ in range(count)]
                assert pool.take(owner, count) == expected
                owners.update(dict.fromkeys(expected, owner))
                held.setdefault(owner, []).extend(expected)
        elif kind == 1 and len(free) >= 3:
            each = [owner, (owner + 1) % 8, owner]
            expected = [free.popleft() for _ in each]
            assert pool.take_each(each) == expected
            owners.update(zip(expected, each))
            for o, b in zip(each, expected):
                held.setdefault(o, []).append(b)
        elif held.get(owner):
            mine = held[owner]
            back = mine[: int(rng.integers(1, len(mine) + 1))]
            if step % 7 == 0:  # someone else's block, or one given back twice: refused, nothing changes
                other = next((held[o][0] for o in held if o != owner and held[o]), back[0])
                with pytest.raises(RuntimeError):
                    pool.give_back(owner, back + [other])
            else:
                pool.give_back(owner, back)
                del mine[: len(back)]
                free.extend(back)
                for b in back:
                    del owners[b]
        assert pool.free_ids() == list(free) and pool.num_free == len(free)
        assert pool.owners() == owners


def test_each_batch_row_carries_its_requests_block_list():
    """The block tables handed out, decode rows and prefill chunks alike (the latter joined from the requests'
    lists when read), against the requests' own block lists at that moment: long prompts chunked over many
    iterations, preempted mid-prompt and resumed with new blocks (recompute and swap), others arriving."""
    for preemption, swap_blocks in ((PreemptKind.RECOMPUTE, 0), (PreemptKind.SWAP, 40)):
        blocks = BlockManager(num_blocks=70, block_size=4, swap_blocks=swap_blocks)
        sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, preemption=preemption),
                          blocks)
        reqs = build_requests([RequestSpec(0, 40 + 37 * (i % 4), 20 + 9 * (i % 3)) for i in range(14)])
        arrivals = {0: reqs[:2]} | {6 * k: [req] for k, req in enumerate(reqs[2:], start=1)}
        chunks, preempted, it = Counter(), 0, 0
        while any(not r.phase.terminal for r in reqs):
            for req in arrivals.get(it, []):
                sched.add(req, it)
            if not sched.has_work():
                it += 1
                continue
            d = sched.schedule(it)
            tables = d.batch.block_tables
            for (req, n), row in zip(d.work, tables):
                assert row[: len(req.block_ids)].tolist() == req.block_ids, (it, req.request_id)
                assert (row[len(req.block_ids):] == -1).all(), (it, req.request_id)
                chunks[req.request_id] += n > 1
            preempted += d.preempted
            sched.postprocess(d, np.full(len(d.batch.sampled_ids), 7), it)
            it += 1
            assert it < 5000
        assert preempted >= 3 and max(chunks.values()) >= 6, (preemption, preempted, chunks)


def test_kv_counters_count_swaps_both_ways():
    blocks = BlockManager(num_blocks=4, block_size=4, swap_blocks=4)
    (req,) = build_requests([RequestSpec(0, 8, 1)])
    blocks.grow(req, 8)
    assert (blocks.allocated_this_iteration, blocks.freed_this_iteration) == (2, 0)
    blocks.reset_counters()
    blocks.swap_out(req)
    assert (blocks.allocated_this_iteration, blocks.freed_this_iteration) == (0, 2)
    blocks.reset_counters()
    blocks.swap_in(req)
    assert (blocks.allocated_this_iteration, blocks.freed_this_iteration) == (2, 0)


def test_fairness_srw_preempts_the_long_request_and_aging_protects_it():
    rows = {r["policy"]: r for r in experiments.fairness(RunSpec(), shorts=200)["rows"]}
    assert rows["fcfs"]["long_preemptions"] == 0
    assert rows["srw"]["long_preemptions"] > 0
    assert rows["srw"]["long_completion_ms"] > rows["fcfs"]["long_completion_ms"]
    assert rows["priority"]["long_completion_ms"] < rows["priority-no-aging"]["long_completion_ms"]
    assert rows["srw"]["long_longest_stall_iterations"] > rows["fcfs"]["long_longest_stall_iterations"]


def test_slot_time_experiment_recovers_slot_time_only_with_variance():
    result = experiments.slot_time(RunSpec(), 160)
    ratios = result["continuous_over_static"]
    assert ratios["uniform"] == pytest.approx(1.0)
    assert ratios["variable"] > 2.0
    static_var = next(r for r in result["rows"] if (r["workload"], r["mode"]) == ("variable", "static"))
    assert static_var["idle_slot_iterations"] == static_var["idle_predicted_from_lengths"] > 0
    assert "variance" in result["conclusion"]
    assert f"in {result['rows'][3]['iterations']} instead of {static_var['iterations']} iterations: x" in result["conclusion"]


def test_slot_time_conclusion_follows_the_figures_when_continuous_loses_throughput():
    # A timed runner on a loaded machine: continuous ran fewer iterations but each took longer.
    def row(workload, mode, iterations, wall_s):
        return {"workload": workload, "mode": mode, "iterations": iterations, "wall_s": wall_s,
                "output_len_mean": 128.0, "output_len_stdev": 0.0 if workload == "uniform" else 230.0,
                "idle_slot_iterations": 0, "idle_held_by_finished": 900, "idle_share": 0.3,
                "idle_predicted_from_lengths": 900}
    rows = [row("uniform", "static", 100, 1.0), row("uniform", "continuous", 100, 1.0),
            row("variable", "static", 2816, 10.0), row("variable", "continuous", 1064, 11.3)]
    text = experiments._conclusion(rows, {"uniform": 1.0, "variable": 10.0 / 11.3})
    assert "in 1064 instead of 2816 iterations: yet x0.88 throughput, since its iterations took 10.62 ms " \
           "against static's 3.55 ms on this run" in text


def test_cancel_frees_blocks_at_the_boundary():
    """A cancel at the boundary of iteration 5 gives the request's blocks back before that iteration runs,
    and records why it ended; blocks still owned, or another reason, would be a leak or a false record."""
    specs = [RequestSpec(0, 8, 30, cancel_at_iteration=5), RequestSpec(0, 8, 30)]
    reqs, clock = build_requests(specs), SimClock()
    blocks = BlockManager(num_blocks=64, block_size=4)
    seen = {}  # iteration -> (owners of the device blocks, free blocks, blocks the live request holds)

    def look(d, start, end):
        seen[d.iteration] = (set(blocks.device.owners().values()), blocks.device.num_free, len(reqs[1].block_ids))

    res = Engine(Scheduler(SchedulerConfig(max_num_seqs=2), blocks), SimulatedRunner(clock), clock,
                 keep_membership=True, on_iteration=look).run(reqs)
    assert reqs[0].phase is Phase.CANCELED and len(reqs[0].output_ids) == 5
    assert reqs[0].stop_reason is Reason.CANCEL_REQUESTED
    assert reqs[0].transitions[-1] == Transition(5, Phase.DECODE, Phase.CANCELED, Reason.CANCEL_REQUESTED)
    assert seen[4][0] == {reqs[0].request_id, reqs[1].request_id}  # both held blocks up to the cancel
    owners, free, held = seen[5]
    assert owners == {reqs[1].request_id} and free == 64 - held
    assert reqs[0].request_id not in res.membership[5] and not reqs[0].block_ids
    assert reqs[1].phase is Phase.FINISHED_LENGTH and blocks.device.num_free == 64


def test_a_handed_out_batch_changes_only_by_rows_taking_their_next_block_in_place():
    """Batch's contract, kept by the scheduler: once handed out, a batch's arrays stay as they were, but for
    -1 entries of the block tables that take the block where the row's next token goes, in the same array."""
    bs = 4
    sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64), BlockManager(200, bs))
    for req in build_requests([RequestSpec(0, 3 + i, 12) for i in range(6)]):  # rows cross blocks in turn
        sched.add(req, 0)
    names = ("request_ids", "start_pos", "num_tokens", "token_ids", "sample", "block_tables", "num_generated")
    previous, grown = None, 0
    for it in range(16):
        if not sched.has_work():
            break
        d = sched.schedule(it)
        if previous is not None:
            batch, copies = previous
            for name in names[:-2] + names[-1:]:
                assert np.array_equal(getattr(batch, name), copies[name]), (it, name)
            before, after = copies["block_tables"], batch.block_tables
            changed = np.argwhere(after != before).tolist()
            if changed:
                assert d.batch.block_tables is after
                row = {rid: j for j, rid in enumerate(d.batch.request_ids.tolist())}
                for i, column in changed:
                    assert before[i, column] == -1
                    assert column == d.batch.start_pos[row[int(batch.request_ids[i])]] // bs
            grown += len(changed)
        previous = d.batch, {name: getattr(d.batch, name).copy() for name in names}
        sched.postprocess(d, np.full(len(d.batch.sampled_ids), 7), it)
    assert grown >= 6  # every row took a block in place at least once


def test_swap_preemption_uses_a_swap_pool_that_fits_exactly():
    blocks = BlockManager(num_blocks=4, block_size=4, swap_blocks=2)
    sched = Scheduler(SchedulerConfig(preemption=PreemptKind.SWAP), blocks)
    (req,) = build_requests([RequestSpec(0, 8, 4)])
    req.move(Phase.PREFILL, Reason.ADMITTED, 0)
    blocks.grow(req, 8)  # two blocks, as many as the swap pool holds
    req.num_computed = 8
    plan = SwapPlan()
    sched._admission.preempt(req, plan, 1)
    assert [device for device, _ in plan.swap_out] == [0, 1] and req.swap_slots == [0, 1]
    assert req.block_ids == [] and req.num_computed == 8 and blocks.swap.num_free == 0  # kept: no recompute
    (other,) = build_requests([RequestSpec(0, 12, 4)])  # three blocks: the swap pool is full, so it recomputes
    other.move(Phase.PREFILL, Reason.ADMITTED, 0)
    blocks.grow(other, 12)
    other.num_computed = 12
    sched._admission.preempt(other, plan, 1)
    assert len(plan.swap_out) == 2 and other.swap_slots == [] and other.num_computed == 0
    assert blocks.device.num_free == 4


@pytest.mark.parametrize("prompt, limit", [(8, Limit.DECODE_RESERVE), (12, Limit.TOKEN_BUDGET)])
def test_a_prompt_held_back_says_whether_the_reserve_or_the_budget_stopped_it(prompt, limit):
    # 10 tokens left, 6 of them open to prefill; chunked prefill off, so a prompt runs whole or not at all.
    # A prompt of 8 would fit the budget but for the decode reserve; one of 12 fits neither.
    (req,) = build_requests([RequestSpec(0, prompt, 4)])
    budget = Budget(tokens=10, prefill_cap=6, seqs=4)
    assert budget.chunk(req, chunked_prefill=False) == 0
    assert budget.limit is limit


def test_preemption_restarts_a_requests_aging():
    # Priority with aging ranks by class and by when a request last joined the queue: a preempted
    # request queues again from its preemption, behind one of its class queued before that.
    sched = Scheduler(SchedulerConfig(policy=Policy.PRIORITY, aging_iterations=8), BlockManager(8, 4))
    early, later = build_requests([RequestSpec(0, 4, 4), RequestSpec(0, 4, 4)])
    early.move(Phase.PREFILL, Reason.ADMITTED, 0)
    later.enqueued_iteration = 5
    sched._admission.preempt(early, SwapPlan(), 10)
    key = sort_key(Policy.PRIORITY, 8)
    assert early.enqueued_iteration == 10 and sorted([early, later], key=key) == [later, early]


def test_a_decode_resumed_from_swap_leaves_prefill_only_the_tokens_left():
    # Token budget 8, no decode reserve. Request a was decoding when it was swapped out; it resumes as a
    # decode (1 token), and b's prompt of 20 is chunked into the 7 tokens left, not the 8 of a fresh budget.
    cfg = SchedulerConfig(preemption=PreemptKind.SWAP, max_num_batched_tokens=8, max_num_seqs=4)
    sched = Scheduler(cfg, BlockManager(num_blocks=16, block_size=4, swap_blocks=16))
    a, b = build_requests([RequestSpec(0, 4, 8), RequestSpec(0, 20, 4)])
    sched.add(a, 0)
    for it in range(2):  # a's prompt, then one decode
        d = sched.schedule(it)
        sched.postprocess(d, np.full(int(d.batch.sample.sum()), 65), it)
    assert a.phase is Phase.DECODE
    sched._preempt(a, 2)  # as the decode pass does when another member needs its blocks
    sched._rows = None  # (outside schedule: the decode rows are rebuilt from the requests, as after a cancel)
    assert a.swap_slots and a.phase is Phase.PREEMPTED
    sched.add(b, 2)
    assert not sched.schedule(2).work  # no admission in the iteration of a preemption
    d = sched.schedule(3)
    assert [(r.request_id, n) for r, n in d.work] == [(a.request_id, 1), (b.request_id, 7)]
    assert d.batch.num_tokens_total == 8 and d.decode_tokens == 1 and d.prefill_tokens == 7


def test_srw_admits_the_request_with_least_remaining_work_first():
    """One slot, four requests queued at once: shortest remaining work (prompt + output tokens) goes first,
    whatever the arrival order. Ranking longest first, or by the prompt or the output alone, changes the order."""
    # remaining work 12, 10, 3, 9: by prompt alone the order would be c, b, a, d; by output alone d, c, a, b
    a, b, c, d = build_requests([RequestSpec(0, 6, 6), RequestSpec(1, 2, 8), RequestSpec(2, 1, 2),
                                 RequestSpec(3, 8, 1)])
    sched = Scheduler(SchedulerConfig(policy=Policy.SRW, max_num_seqs=1, max_num_batched_tokens=64),
                      BlockManager(64, 4))
    decisions = _drive(sched, [a, b, c, d])
    assert [r.first_scheduled_iteration for r in (c, d, b, a)] == [0, 2, 3, 11]
    assert [_finish_iteration(r) for r in (c, d, b, a)] == [1, 2, 10, 16]
    assert [x.admitted for x in decisions[:4]] == [1, 0, 1, 1]


def test_transitions_are_recorded_at_the_iteration_they_happen():
    """A 100-token prompt under a 32-token budget runs in chunks at iterations 0-3; the last chunk samples
    the first token, so decoding starts at 3, and the fourth token (iteration 6) ends it."""
    reqs, _ = _run(Mode.CONTINUOUS, [RequestSpec(0, 100, 4)], capacity=4, max_num_batched_tokens=32)
    assert reqs[0].transitions == [Transition(0, Phase.WAITING, Phase.PREFILL, Reason.ADMITTED),
                                   Transition(3, Phase.PREFILL, Phase.DECODE, Reason.PROMPT_DONE),
                                   Transition(6, Phase.DECODE, Phase.FINISHED_LENGTH, Reason.MAX_TOKENS)]


def test_a_prompt_arriving_among_decodes_gets_only_the_tokens_they_leave():
    """Token budget 8, three running decodes: an 8-token prompt arriving at iteration 2 gets a chunk of 5, then
    the 3 left. Giving it the whole prefill room (8) would run 11 tokens in an iteration of 8."""
    reqs = build_requests([RequestSpec(0, 2, 10)] * 3 + [RequestSpec(0, 8, 4)])
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8), BlockManager(64, 4))
    decisions = _drive(sched, reqs, arrivals={0: reqs[:3], 2: reqs[3:]})
    assert all(d.batch.num_tokens_total <= 8 for d in decisions)
    assert [(d.prefill_tokens, d.decode_tokens) for d in decisions[:5]] == [(6, 0), (0, 3), (5, 3), (3, 3), (0, 4)]
    assert [[(r.request_id, n) for r, n in d.work if r is reqs[3]] for d in decisions[2:4]] == [[(3, 5)], [(3, 3)]]
