"""The engine's bookkeeping against plain recomputations: the event table's order across row groups,
and the `tokens` marks (which requests got a token, and when that set changed)."""
from __future__ import annotations

import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from itertrace.profiler import workloads as wl
from itertrace.profiler.clock import SimClock
from itertrace.profiler.decision import Event, EventKind, TokenEvents
from itertrace.profiler.engine import Engine
from itertrace.profiler.kv import BlockManager
from itertrace.profiler.nvtx_ranges import Tracer, tokens_text
from itertrace.profiler.request import PreemptKind, Reason
from itertrace.profiler.runlog import ITERATIONS, RunLog
from itertrace.profiler.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.sim_runner import SimulatedRunner


def test_event_rows_and_token_blocks_keep_their_order_across_row_groups(tmp_path):
    log = RunLog(tmp_path, rows_per_group=4)
    batches = [
        [(Event(1, 0, EventKind.ARRIVE, Reason.ARRIVED), 5), (Event(1, 0, EventKind.ADMIT, Reason.ADMITTED), 6),
         (TokenEvents(0, np.array([1, 2, 3]), np.array([True, False, False])), 9),
         (Event(2, 0, EventKind.FINISH, Reason.MAX_TOKENS), 9)],
        [],
        [(TokenEvents(1, np.array([4, 5]), np.array([False, True])), 20),
         (TokenEvents(1, np.array([6]), np.array([False])), 20)],
        [(Event(7, 2, EventKind.PREFILL_CHUNK, None, 16), 30), (TokenEvents(2, np.array([8]), np.array([True])), 31)],
    ]
    for stamped in batches:
        for ev, ts in stamped:
            if isinstance(ev, TokenEvents):
                log.token_events(ev.request_ids, ev.iteration, ts, ev.first)
            else:
                log.event(ev.request_id, ev.iteration, ts, ev.kind.value, ev.reason.value if ev.reason else None,
                          ev.tokens)
    log.close({})
    expected = []
    for stamped in batches:
        for ev, ts in stamped:
            if isinstance(ev, TokenEvents):
                expected += [{"request_id": rid, "iteration": ev.iteration, "ts_ns": ts,
                              "kind": "first_token" if first else "token", "reason": None, "tokens": 1}
                             for rid, first in zip(ev.request_ids.tolist(), ev.first.tolist())]
            else:
                expected.append({"request_id": ev.request_id, "iteration": ev.iteration, "ts_ns": ts,
                                 "kind": ev.kind.value, "reason": ev.reason.value if ev.reason else None,
                                 "tokens": ev.tokens})
    file = pq.ParquetFile(tmp_path / "events.parquet")
    assert file.read().to_pylist() == expected
    assert [file.metadata.row_group(i).num_rows for i in range(file.num_row_groups)] == [4, 4, 3]


def test_rows_in_bulk_land_where_the_same_rows_one_by_one_would(tmp_path):
    """Iteration rows given as columns (quiet stretches) among rows given one by one, across row groups,
    against the same rows all given one by one; the token rows given in bulk likewise."""
    rng = random.Random(5)
    template = {name: 0 for name in ITERATIONS.names} | {"policy": "fcfs", "limit": "queue_empty", "simulated": True}
    one_by_one, in_bulk = RunLog(tmp_path / "a", rows_per_group=5), RunLog(tmp_path / "b", rows_per_group=5)
    iteration = 0
    for _ in range(12):
        members = np.array(rng.sample(range(50), rng.randint(0, 4)), dtype=np.int64)
        row = template | {"iteration": iteration, "member_ids": members, "scheduled_ids": members[:1],
                          "finished_member_ids": np.empty(0, dtype=np.int64), "limit": rng.choice(["a", "b"])}
        one_by_one.iteration(row)
        in_bulk.iteration(row)
        one_by_one.token_events(members, iteration, iteration * 10, np.zeros(len(members), dtype=bool))
        in_bulk.token_events(members, iteration, iteration * 10, np.zeros(len(members), dtype=bool))
        n = rng.randint(0, 7)
        numbers = np.arange(iteration + 1, iteration + 1 + n)
        for k in range(n):
            one_by_one.iteration(row | {"iteration": int(numbers[k]), "kv_in_use": k * k})
            one_by_one.token_events(members, int(numbers[k]), int(numbers[k]) * 10, np.zeros(len(members), dtype=bool))
        if n:
            in_bulk.iterations(row | {"iteration": numbers, "kv_in_use": np.arange(n) ** 2}, n)
            in_bulk.token_steps(members, numbers, numbers * 10)
        iteration += n + 1
    one_by_one.close({})
    in_bulk.close({})
    for name in ("iterations", "events"):
        a, b = pq.ParquetFile(tmp_path / "a" / f"{name}.parquet"), pq.ParquetFile(tmp_path / "b" / f"{name}.parquet")
        assert b.read().equals(a.read()), name
        assert b.metadata.num_row_groups == a.metadata.num_row_groups > 2


class _Recorder(Tracer):
    """Keeps the text of every `tokens` mark by iteration, besides emitting it."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[int, str] = {}

    def tokens(self, iteration, added, removed) -> None:
        self.marks[iteration] = tokens_text(added, removed)
        super().tokens(iteration, added, removed)


def test_tokens_marks_are_the_changes_in_who_got_a_token(tmp_path):
    rng = random.Random(3)
    specs = [wl.RequestSpec(arrival_ns=rng.randrange(0, 50_000_000), prompt_tokens=rng.choice([3, 20, 90]),
                            output_tokens=rng.choice([1, 4, 30]),
                            cancel_at_iteration=rng.randint(1, 40) if i % 9 == 4 else None) for i in range(60)]
    requests = wl.build_requests(specs)
    for req in requests:  # ids that are not 0 .. n-1: the engine finds their rows by search
        req.request_id = 1000 + 3 * req.request_id
    clock, tracer = SimClock(), _Recorder()
    sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64, preemption=PreemptKind.RECOMPUTE),
                      BlockManager(24, 4))
    got: list[set[int]] = []  # by iteration
    engine = Engine(sched, SimulatedRunner(clock), clock, tracer=tracer,
                    on_iteration=lambda d, start, end: got.extend(
                        [set()] * (d.iteration - len(got)) + [set(d.batch.sampled_ids.tolist())]))
    result = engine.run(requests)
    got += [set()] * (result.iterations - len(got))  # iterations with no forward pass: nobody got one
    expected, previous = {}, set()
    for iteration, now in enumerate(got):
        if now != previous:
            expected[iteration] = tokens_text(sorted(now - previous), sorted(previous - now))
        previous = now
    assert tracer.marks == expected
    assert any(" -" in text for text in expected.values()) and len(expected) > 10


def test_a_failed_write_on_the_writer_thread_is_raised_and_leaves_no_complete_table(tmp_path, monkeypatch):
    """Row groups are written on a thread: its error must reach the engine's thread, and the run
    directory must not look complete (no run.json, no table under its final name)."""
    log = RunLog(tmp_path, rows_per_group=2)

    def full_disk(self, table, row_group_size=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    with pytest.raises(OSError, match="No space left"):  # at a later flush, or at the latest at close
        for i in range(5):  # two row groups handed over while the rows come, the last row at close
            log.event(i, i, i, "arrive", "arrived", 0)
        log.close({})
    assert not (tmp_path / "run.json").exists() and not (tmp_path / "events.parquet").exists()


class _ReadingRunner(SimulatedRunner):
    """The simulated runner as a runner that reads token ids: it keeps every batch's ids and positions."""

    reads_tokens = True

    def __init__(self, clock) -> None:
        super().__init__(clock)
        self.seen: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def forward(self, prepared) -> None:
        self.seen.append((prepared.request_ids, prepared.start_pos, prepared.num_tokens, prepared.token_ids))
        super().forward(prepared)


def _logged_run(runner_class, tmp_path):
    specs = [wl.RequestSpec(i * 3_000_000, 20 + 9 * (i % 6), 12 + 7 * (i % 5)) for i in range(14)]
    reqs = wl.build_requests(specs)
    clock = SimClock()
    runner = runner_class(clock)
    cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=48)  # prompts run in chunks
    engine = Engine(Scheduler(cfg, BlockManager(16, 8)), runner, clock, log=RunLog(tmp_path))  # short of KV
    engine.run(reqs)
    engine.log.close({})
    tables = {name: pq.read_table(tmp_path / f"{name}.parquet") for name in ("iterations", "events", "requests")}
    return reqs, runner, tables


def test_a_runner_that_never_reads_tokens_makes_no_prompt_and_logs_the_same_run(tmp_path):
    """The simulated runner needs only how many tokens each row runs: its batches carry -1 for prefill
    tokens and no synthetic prompt is ever made. A runner that reads them gets every row's real ids
    (prompt, then output after a recompute); the two runs' logs are identical."""
    reqs, _, tables = _logged_run(SimulatedRunner, tmp_path / "sim")
    assert all(r.prompt_ids._ids is None for r in reqs)  # never made
    read_reqs, reader, read_tables = _logged_run(_ReadingRunner, tmp_path / "read")
    for name, table in tables.items():
        assert read_tables[name].equals(table), f"{name} table differs"
    assert sum(r.num_preemptions for r in read_reqs) > 0  # recomputes replay prompt and output tokens
    by_id = {r.request_id: r for r in read_reqs}
    chunks = 0
    for ids, starts, counts, tokens in reader.seen:
        ends = np.cumsum(counts)
        for rid, start, n, end in zip(ids.tolist(), starts.tolist(), counts.tolist(), ends.tolist()):
            r = by_id[rid]
            assert tokens[end - n: end].tolist() == [*r.prompt_ids, *r.output_ids][start: start + n]
            chunks += n > 1
    assert chunks > len(read_reqs)  # prompts ran in chunks, and again after recomputes
