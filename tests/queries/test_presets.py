"""The vllm, sglang and trtllm presets, auto and mapping suggest, on synthetic captures with those engines' names.

Each capture (tests/engine_captures.py) is written as an nsys parquetdir export and ingested like a
real one. The iterations, host gaps and GPU time the queries give are checked against a plain-Python
computation from what the capture was built from: device intervals as Nsight's projection defines
them (the GPU work of the calls inside a step range on its thread), gaps between them per track, and
gpu_time_reference's accounting. Vllm's and SGLang's loops launch iteration N+1 while N still runs,
and one capture's iteration ranges overlap on the host.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

import engine_captures as ec
import pytest
from gpu_time_reference import CUDA, NVTX, HostInterval, accounting, api_class, clipped_calls, leaves

from itertrace.cli import main
from itertrace.errors import UserError
from itertrace.ingest import ingest
from itertrace.queries import QueryDB

ENGINES = {"vllm": ec.vllm, "sglang-nvtx": ec.sglang, "trtllm": ec.trtllm}
OVERLAPPING = {"preset": "generic", "step_pattern": r"^decode_step_(\d+)$", "iteration_from": "text"}


@pytest.fixture(scope="module", params=list(ENGINES), ids=str)
def engine(request, tmp_path_factory):
    """(preset, Built, database) for one engine's capture."""
    built = ENGINES[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    ingest([built.capture.write(folder / "export")], folder / "capture.duckdb")
    return request.param, built, folder / "capture.duckdb"


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory):
    built = ec.overlapping_steps()
    folder = tmp_path_factory.mktemp("overlapping")
    ingest([built.capture.write(folder / "export")], folder / "capture.duckdb")
    return built, folder / "capture.duckdb"


def rows(db: QueryDB, sql: str) -> list[tuple]:
    return [tuple(r.values()) for r in db.sql(sql).to_pylist()]


def device_intervals(built: ec.Built, step: re.Pattern) -> dict[int, list[tuple[int, int, int]]]:
    """Per thread, each step range's (host start, device start, device end) in start order, from the build."""
    work = {w.correlation_id: w for w in built.capture.gpu_work}
    out = defaultdict(list)
    for r in built.capture.ranges:
        if step.search(r.text):
            ops = [work[c.correlation_id] for c in built.capture.calls if c.correlation_id in work
                   and c.tid == r.tid and r.start_ns <= c.start_ns and c.end_ns <= r.end_ns]
            out[r.tid].append((r.start_ns, min(w.start_ns for w in ops), max(w.end_ns for w in ops)))
    return {tid: sorted(v) for tid, v in out.items()}


def idle_in(start: int, end: int, busy: list[tuple[int, int]]) -> int:
    """Nanoseconds of [start, end) in which none of the `busy` intervals runs, counted instant by instant."""
    edges = sorted({start, end, *(t for b in busy for t in b if start < t < end)})
    return sum(b - a for a, b in zip(edges, edges[1:]) if not any(s <= a and b <= e for s, e in busy))


def expected_gaps(intervals: dict[int, list[tuple[int, int, int]]],
                  built: ec.Built | None = None) -> list[tuple[int, int, int, int]]:
    """(track, gap start, gap end, gap) between consecutive device intervals, as host_gaps defines them: the
    gap's idle time, in which no GPU work of the track's process runs (none given: no GPU work at all)."""
    out = []
    for tid, steps in intervals.items():
        busy = [(w.start_ns, w.end_ns) for w in built.capture.gpu_work if w.pid == tid & ~0xFFFFFF] if built else []
        ordered = sorted((ds, de) for _, ds, de in steps)
        until = ordered[0][1]
        for start, end in ordered[1:]:
            out.append((tid, min(until, start), start, idle_in(until, start, busy) if start > until else 0))
            until = max(until, end)
    return sorted(out)


def expected_accounting(built: ec.Built, db: QueryDB) -> dict[tuple[int, int], tuple]:
    """Per (device, process), gpu_time_reference's accounting of the build under the mapping in effect, over
    that GPU's window: its work's first start to last end."""
    step_pattern, domain, phase_pattern = rows(db, "SELECT step_pattern, domain, phase_pattern FROM mapping")[0]
    cap = built.capture
    launched = {w.correlation_id for w in cap.gpu_work}
    launches = Counter(c.tid for c in cap.calls if c.correlation_id in launched)
    intervals = device_intervals(built, re.compile(step_pattern))

    def phase(text: str) -> str:
        m = re.search(phase_pattern, text)
        return m.group(1) if m and m.groups() and m.group(1) else re.sub(r"[0-9]+", "#", text)

    out = {}
    for device, pid in sorted({(w.device, w.pid) for w in cap.gpu_work}):
        phases = [(r.tid, r.start_ns, r.end_ns, r.text) for r in cap.ranges if r.tid & ~0xFFFFFF == pid and r.push_pop
                  and re.search(phase_pattern, r.text) and (domain is None or r.domain == domain)]
        host = [HostInterval(tid, a, b, NVTX, launches[tid], "nvtx", phase(text)) for tid, a, b, text in leaves(phases)]
        host += [HostInterval(tid, a, b, CUDA, launches[tid], api_class(name), name) for tid, a, b, name in
                 clipped_calls([(c.tid, c.start_ns, c.end_ns, c.name, c.correlation_id) for c in cap.calls
                                if c.tid & ~0xFFFFFF == pid and launches[c.tid]])]
        iterations = [(ds, de, None) for tid, steps in intervals.items() if tid & ~0xFFFFFF == pid
                      for _, ds, de in steps]
        ops = [(w.start_ns, w.end_ns) for w in cap.gpu_work if (w.device, w.pid) == (device, pid)]
        window = (min(a for a, _ in ops), max(b for _, b in ops))  # an nsys capture's: its GPU work's span
        out[device, pid] = accounting(window, ops, iterations, host)
    return out


def test_auto_chooses_the_engines_preset_and_suggest_ranks_its_step_first(engine):
    preset, built, path = engine
    with QueryDB(path) as db:
        assert db.mapping_choice.preset == preset
        ranks = built.steps * (2 if preset == "trtllm" else 1)
        assert (db.mapping_choice.ranges, db.mapping_choice.name) == (ranks, built.step_name)
        assert f"--param preset={preset}" in db.mapping_choice.note
        first = db.sql("SELECT name, preset, params FROM mapping_suggest WHERE rank = 1").to_pylist()
    assert first == [{"name": built.step_name, "preset": preset, "params": f"--param preset={preset}"}]


def test_iterations_and_host_gaps_agree_with_the_projection_of_the_build(engine):
    preset, built, path = engine
    with QueryDB(path, {"preset": preset}) as db:
        intervals = device_intervals(built, re.compile(rows(db, "SELECT step_pattern FROM mapping")[0][0]))
        got = defaultdict(list)
        for tid, start, ds, de in rows(db, "SELECT global_tid, host_start_ns, device_start_ns, device_end_ns "
                                           "FROM iterations ORDER BY global_tid, host_start_ns"):
            got[tid].append((start, ds, de))
        assert dict(got) == intervals
        gaps = sorted(rows(db, "SELECT global_tid, gap_start_ns, gap_end_ns, gap_ns FROM host_gaps"))
        assert gaps == expected_gaps(intervals, built)
        assert sum(g[3] for g in gaps) > 0 and any(g[3] == 0 for g in gaps) == (preset != "trtllm")
        by_gap = rows(db, "SELECT global_tid, iteration, sum(dur_ns) FROM host_gaps_parts GROUP BY ALL ORDER BY ALL")
        assert sorted(by_gap) == sorted(rows(db, "SELECT global_tid, iteration, gap_ns FROM host_gaps"))


def test_gpu_time_and_its_idle_parts_agree_with_the_plain_python_accounting(engine):
    preset, built, path = engine
    with QueryDB(path) as db:
        reference = expected_accounting(built, db)
        times = {(r[0], r[1]): r for r in rows(db, "SELECT * FROM gpu_time")}
        parts = Counter()
        for device, pid, kind, cause_kind, cause, ns in rows(db, "SELECT device_id, global_pid, kind, cause_kind, cause, "
                                                                 "sum(dur_ns) FROM gpu_idle_parts GROUP BY ALL"):
            parts[device, pid, kind, cause_kind, cause] += ns
    assert set(times) == set(reference) and len(times) == (2 if preset == "trtllm" else 1)
    for key, (busy, kinds, causes) in reference.items():
        row = times[key]
        assert (row[7], row[9], row[10], row[11]) == (busy, kinds["within"], kinds["between"], kinds["outside"])
        assert row[5] == row[7] + row[9] + row[10] + row[11]
        assert kinds["between"] > 0
        assert {k[2:]: v for k, v in parts.items() if k[:2] == key and v} == dict(causes)


def test_vllm_and_trtllm_steps_carry_their_batch_counts(engine):
    preset, built, path = engine
    with QueryDB(path) as db:
        counts = rows(db, "SELECT global_tid, iteration, prefill_requests, prefill_tokens, decode_requests, "
                          "decode_tokens FROM step_counts ORDER BY global_tid, iteration")
    if preset == "sglang-nvtx":  # its step's text carries no counts
        assert {c[2:] for c in counts} == {(None, None, None, None)}
        return
    tracks = sorted({c[0] for c in counts})
    assert [c[2:] for c in counts] == built.counts * len(tracks)
    if preset == "trtllm":  # numbered from the text, the same on every rank
        assert [c[1] for c in counts] == list(range(1, built.steps + 1)) * len(tracks)


def test_a_preset_whose_names_are_absent_says_which_it_looked_for(engine, capsys):
    preset, _, path = engine
    other = "sglang-nvtx" if preset != "sglang-nvtx" else "trtllm"
    with pytest.raises(UserError, match=rf"preset {other}: no NVTX range or stack frame in this capture matches its "
                                        r"iteration range \('.+' in (any domain|domain 'TensorRT-LLM')\)"):
        QueryDB(path, {"preset": other})
    assert main(["query", "host_gaps", "--db", str(path), "--param", "preset=itertrace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["itertrace: error: preset itertrace: no NVTX range or stack frame in this capture matches its "
                   "iteration range ('^step$' in domain 'itertrace'); `itertrace mapping suggest --db FILE` ranks the "
                   "ranges that could be one"]


def test_query_says_which_mapping_auto_chose(engine, capsys):
    preset, built, path = engine
    assert main(["query", "host_gaps_summary", "--db", str(path), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("global_tid,iterations,")
    assert err.startswith(f"itertrace: note: mapping: auto chose the {preset} preset: ")
    assert err.endswith(f"(the same explicitly: --param preset={preset})\n") and err.count("\n") == 1


def test_mapping_suggest_prints_candidates_and_their_param_lines(engine, capsys):
    preset, built, path = engine
    assert main(["mapping", "suggest", "--db", str(path), "--limit", "3"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["rank", "name"] and lines[2].split()[0] == "1" and built.step_name in lines[2]
    assert f"1: --param preset={preset}" in lines
    assert err.startswith(f"itertrace: mapping: auto chose the {preset} preset")


def test_overlapping_iteration_ranges_keep_gaps_and_idle_parts_exact(overlapping):
    built, path = overlapping
    with QueryDB(path, OVERLAPPING) as db:
        intervals = device_intervals(built, re.compile(OVERLAPPING["step_pattern"]))
        hosts = rows(db, "SELECT host_start_ns, host_end_ns FROM iterations ORDER BY host_start_ns")
        assert len(hosts) == built.steps and all(b[0] < a[1] for a, b in zip(hosts, hosts[1:]))  # they overlap
        assert sorted(rows(db, "SELECT global_tid, gap_start_ns, gap_end_ns, gap_ns FROM host_gaps")) == \
            expected_gaps(intervals, built)
        reference = expected_accounting(built, db)
        ((key, (busy, kinds, causes)),) = reference.items()
        row = rows(db, "SELECT * FROM gpu_time")[0]
        assert (row[7], row[9], row[10], row[11]) == (busy, kinds["within"], kinds["between"], kinds["outside"])
        parts = {(k, ck, c): ns for k, ck, c, ns in rows(
            db, "SELECT kind, cause_kind, cause, sum(dur_ns) FROM gpu_idle_parts GROUP BY ALL") if ns}
        assert parts == dict(causes) and kinds["within"] > 0
    with QueryDB(path) as db:  # auto finds them too
        assert db.mapping_choice.name == "decode_step_#"
        assert rows(db, "SELECT name FROM mapping_suggest WHERE rank = 1") == [("decode_step_#",)]
