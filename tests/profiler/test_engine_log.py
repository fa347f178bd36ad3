"""The engine's bookkeeping against plain recomputations: the event table's order across row groups,
and the `tokens` marks (which requests got a token, and when that set changed)."""
from __future__ import annotations

import random
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest

from itertrace.profiler import workloads as wl
from itertrace.profiler.clock import SimClock
from itertrace.profiler.scheduling.decision import Event, EventKind, TokenEvents
from itertrace.profiler.engine import Engine
from itertrace.profiler.scheduling.kv import BlockManager
from itertrace.profiler.tracing.nvtx_ranges import Tracer, tokens_text
from itertrace.profiler.scheduling.request import PreemptKind, Reason
from itertrace.profiler.tracing.runlog import ITERATIONS, RunLog
from itertrace.profiler.scheduling.scheduler import Scheduler, SchedulerConfig
from itertrace.profiler.runners.sim_runner import SimulatedRunner


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
    """Iteration rows given as columns (stretches run in bulk; a few of them go in as rows, many as a part of
    columns) among rows given one by one, across row groups, against the same rows all given one by one; the
    token rows given in bulk likewise, with a prompt chunk's row before each iteration's tokens but the first."""
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
        n = rng.choice([0, 1, 3, 7, 17, 30])
        chunk = rng.choice([None, (int(members[0]) if len(members) else 7, 100)])
        numbers = np.arange(iteration + 1, iteration + 1 + n)
        for k in range(n):
            one_by_one.iteration(row | {"iteration": int(numbers[k]), "kv_in_use": k * k})
            if chunk and k:
                one_by_one.event(chunk[0], int(numbers[k]), int(numbers[k]) * 10 - 3, "prefill_chunk", None, chunk[1])
            one_by_one.token_events(members, int(numbers[k]), int(numbers[k]) * 10, np.zeros(len(members), dtype=bool))
        if n:
            in_bulk.iterations(row | {"iteration": numbers, "kv_in_use": np.arange(n) ** 2}, n)
            in_bulk.token_steps(members, numbers, numbers * 10, chunk and (*chunk, numbers * 10 - 3))
        iteration += n + 1
    one_by_one.close({})
    in_bulk.close({})
    for name in ("iterations", "events"):
        a, b = pq.ParquetFile(tmp_path / "a" / f"{name}.parquet"), pq.ParquetFile(tmp_path / "b" / f"{name}.parquet")
        assert b.read().equals(a.read()), name
        assert b.metadata.num_row_groups == a.metadata.num_row_groups > 2


class _Recorder(Tracer):
    """Keeps the text of every `tokens` mark by iteration, besides emitting it."""

    def __init__(self, clock) -> None:
        super().__init__(clock)
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
    clock = SimClock()
    tracer = _Recorder(clock)
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
    write_table, calls = pq.ParquetWriter.write_table, []

    def full_disk_once(self, table, row_group_size=None):  # only the first row group fails
        calls.append(table.num_rows)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        write_table(self, table, row_group_size=row_group_size)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk_once)
    with pytest.raises(OSError, match="No space left"):  # at a later flush, or at the latest at close
        for i in range(5):  # two row groups handed over while the rows come, the last row at close
            log.event(i, i, i, "arrive", "arrived", 0)
        log.close({})
    assert calls[0] == 2  # the events' first row group
    assert not (tmp_path / "run.json").exists() and not (tmp_path / "events.parquet").exists()


def test_abort_drops_the_row_groups_the_writer_has_not_started(tmp_path, monkeypatch):
    started, release = [], threading.Event()

    def slow_write(self, table, row_group_size=None):
        started.append(table.num_rows)
        release.wait(5)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", slow_write)
    log = RunLog(tmp_path, rows_per_group=1)
    log.event(0, 0, 0, "arrive", "arrived", 0)  # the first row group: the writer takes it and waits
    log.event(1, 0, 0, "arrive", "arrived", 0)  # the second: queued behind it
    threading.Timer(0.2, release.set).start()
    log.abort()  # waits for the write under way, drops the queued one
    assert started == [1]
    assert not any(p.suffix == ".parquet" or p.name == "run.json" for p in tmp_path.iterdir())


def test_a_run_that_fails_aborts_its_logs(tmp_path, monkeypatch):
    """The engine raises mid-run: its run logs are aborted (RunLog.abort), in session.run and run_in_turn."""
    from itertrace.profiler import session

    aborted = []
    monkeypatch.setattr(RunLog, "abort", lambda self: aborted.append(self.run_dir))

    def broken_forward(self, prepared):
        raise RuntimeError("device lost")

    monkeypatch.setattr(SimulatedRunner, "forward", broken_forward)
    reqs = lambda: wl.build_requests([wl.RequestSpec(0, 8, 4)] * 3)  # noqa: E731
    with pytest.raises(RuntimeError, match="device lost"):
        session.run(session.RunSpec(), reqs(), run_dir=tmp_path / "a")
    with pytest.raises(RuntimeError, match="device lost"):
        session.run_in_turn([(session.RunSpec(), reqs(), tmp_path / "b", "w"), (session.RunSpec(), reqs(), None, "w")])
    assert aborted == [tmp_path / "a", tmp_path / "b"]
