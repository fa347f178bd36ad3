"""Diff tests of queries/host_gaps.sql: gaps between device intervals, and each gap split into host phases."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from query_fixtures import (TID_A, TID_B, TID_C, TraceDB, api_call, gpu_op, projection, push_pop,
                            start_end, phase, step)


def gpu_launch(n: int, call_ns: int, gpu_start_ns: int, gpu_end_ns: int) -> dict[str, list[dict]]:
    """A CUDA API call at call_ns (2 ns long) on thread A and the kernel it launched; correlation id n."""
    return {"cuda_api": [api_call(n, call_ns, call_ns + 2, correlation_id=n)],
            "gpu_ops": [gpu_op(n, gpu_start_ns, gpu_end_ns, correlation_id=n)]}


def merge(*parts: dict[str, list[dict]]) -> dict[str, list[dict]]:
    tables: dict[str, list[dict]] = {}
    for part in parts:
        for table, rows in part.items():
            tables.setdefault(table, []).extend(rows)
    return tables


def parts_by_gap(trace: TraceDB, params: dict[str, str] | None = None) -> dict[tuple, int]:
    """{(global_tid, iteration): sum of that gap's parts}."""
    sums: Counter = Counter()
    for tid, iteration, _, dur_ns in trace.query("host_gaps_parts", params):
        sums[tid, iteration] += dur_ns
    return dict(sums)


def gap_lengths(trace: TraceDB, params: dict[str, str] | None = None) -> dict[tuple, int]:
    return {(tid, iteration): gap_ns for tid, _, iteration, _, _, gap_ns in trace.query("host_gaps", params)}


# A CPU run: the device interval of each step is its forward range. The gap [70, 120) holds the end
# of step 0 and the start of step 1.
CPU_TWO_STEPS = {"nvtx_ranges": [
    step(1, 0, 0, 100),
    phase(2, "schedule", 0, 10, 1),
    phase(3, "prepare", 10, 20, 1),
    phase(4, "forward", 20, 70, 1),
    phase(5, "sample", 70, 80, 1),
    phase(6, "detokenize", 80, 90, 1),
    phase(7, "postprocess", 90, 98, 1),
    step(8, 1, 100, 200),
    phase(9, "schedule", 100, 115, 8),
    phase(10, "prepare", 115, 120, 8),
    phase(11, "forward", 120, 170, 8),
]}

# A GPU run. Step 0's kernel runs long, past the start of step 1's kernel: overlapping device work,
# so the gap before iteration 1 is 0, and the gap before iteration 2 starts at the end of step 0's kernel.
GPU_THREE_STEPS = merge(
    {"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "schedule", 0, 10, 1),
        phase(3, "forward", 10, 60, 1),
        phase(4, "sample", 60, 95, 1),
        step(5, 1, 100, 200),
        phase(6, "schedule", 100, 105, 5),
        phase(7, "forward", 105, 150, 5),
        phase(8, "sample", 150, 190, 5),
        step(9, 2, 200, 300),
        phase(10, "schedule", 200, 220, 9),
        phase(11, "forward", 220, 280, 9),
    ],
     "nvtx_gpu_projection": [projection(1, 30, 120, 1), projection(3, 30, 120, 1),
                             projection(5, 115, 118, 1), projection(7, 115, 118, 1),
                             projection(9, 250, 290, 1), projection(11, 250, 290, 1)]},
    gpu_launch(1, 20, 30, 120),
    gpu_launch(2, 110, 115, 118),
    gpu_launch(3, 230, 250, 290),
)


def test_no_ranges_no_gaps(trace):
    trace.load()
    for view in ("host_gaps", "host_gaps_parts", "host_gaps_by_phase", "host_gaps_summary", "host_gaps_worst"):
        assert trace.query(view) == [], view


def test_one_iteration_no_gap(trace):
    trace.load({"nvtx_ranges": CPU_TWO_STEPS["nvtx_ranges"][:7]})
    assert trace.query("host_gaps") == []
    assert trace.query("host_gaps_parts") == []
    # (global_tid, iterations, gaps, wall_ns, gap_total_ns, gap_share, p50, p90, p99, max, launch_latency_p50_ns)
    assert trace.query("host_gaps_summary") == [(TID_A, 1, 0, 50, 0, 0.0, None, None, None, None, None)]


def test_gap_runs_from_one_device_end_to_the_next_device_start(trace):
    trace.load(CPU_TWO_STEPS)
    # (global_tid, prev_iteration, iteration, gap_start_ns, gap_end_ns, gap_ns)
    assert trace.query("host_gaps") == [(TID_A, 0, 1, 70, 120, 50)]


# host_gaps_parts of CPU_TWO_STEPS: (global_tid, iteration, phase, dur_ns); 98..100 lies between the
# steps: unattributed.
CPU_TWO_STEPS_PARTS = [
    (TID_A, 1, "detokenize", 10),
    (TID_A, 1, "postprocess", 8),
    (TID_A, 1, "prepare", 5),
    (TID_A, 1, "sample", 10),
    (TID_A, 1, "schedule", 15),
    (TID_A, 1, "unattributed", 2),
]


def test_gap_split_among_the_phases_it_overlaps_and_unattributed(trace):
    trace.load(CPU_TWO_STEPS)
    assert trace.query("host_gaps_parts") == CPU_TWO_STEPS_PARTS


def test_only_innermost_phases_count_and_start_end_ranges_take_no_part(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100),
        phase(2, "forward", 20, 70, 1),
        phase(3, "sample", 70, 80, 1),
        push_pop(4, "aten::argmax", 72, 76, parent=3, depth=2, domain=None),  # not a phase: sample still counts
        start_end(5, "schedule", 75, 110),  # start/end: may overlap anything, takes no part
        phase(6, "postprocess", 80, 98, 1),
        phase(7, "detokenize", 85, 95, 6, depth=2),  # a phase inside a phase: only the inner one counts
        step(8, 1, 100, 200),
        phase(9, "schedule", 100, 115, 8),
        phase(10, "forward", 120, 170, 8),
    ]})
    # postprocess outside detokenize (80..85, 95..98), 98..100 and 115..120 are unattributed.
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "detokenize", 10),
        (TID_A, 1, "sample", 10),
        (TID_A, 1, "schedule", 15),
        (TID_A, 1, "unattributed", 15),
    ]


def test_gpu_work_of_another_stream_inside_a_gap_is_no_gap_time(trace):
    """A kernel launched outside every step (a sampler after the step's range, a copy on a stream of its own)
    runs inside the would-be gap before iteration 2, [120, 250): the device is busy then, so the gap is the
    rest, 100 ns, split only over its idle pieces [120, 160) and [190, 250); and the track's gap time equals
    gpu_time's idle time between iterations, one definition of idle."""
    tables = merge(GPU_THREE_STEPS, gpu_launch(4, 140, 160, 190))
    tables["gpu_ops"] = [{**op, "device_id": 0} for op in tables["gpu_ops"]]  # one GPU, so that gpu_time has a row
    trace.load(tables)
    assert trace.query("host_gaps") == [(TID_A, 0, 1, 115, 115, 0), (TID_A, 0, 2, 120, 250, 100)]
    assert [p for p in trace.query("host_gaps_parts") if p[1] == 2] == [
        (TID_A, 2, "forward", 60), (TID_A, 2, "sample", 10), (TID_A, 2, "schedule", 20), (TID_A, 2, "unattributed", 10)]
    ((between,),) = trace.sql("SELECT idle_between_ns FROM gpu_time")
    assert between == sum(g[5] for g in trace.query("host_gaps")) == 100


def test_overlapping_device_work_makes_a_zero_gap(trace):
    trace.load(GPU_THREE_STEPS)
    # Iteration 1's kernel starts at 115, before iteration 0's ends at 120: gap 0. The next gap
    # starts at 120, the latest device end so far, which is iteration 0's.
    assert trace.query("host_gaps") == [
        (TID_A, 0, 1, 115, 115, 0),
        (TID_A, 0, 2, 120, 250, 130),
    ]


def test_zero_gap_has_one_zero_unattributed_part(trace):
    trace.load(GPU_THREE_STEPS)
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "unattributed", 0),
        (TID_A, 2, "forward", 60),  # 120..150 of step 1's forward, 220..250 of step 2's
        (TID_A, 2, "sample", 40),
        (TID_A, 2, "schedule", 20),
        (TID_A, 2, "unattributed", 10),
    ]


def test_iterations_without_device_work_are_skipped_and_sources_mix(trace):
    trace.load(merge(
        {"nvtx_ranges": [
            step(1, 0, 0, 100),
            phase(2, "forward", 10, 90, 1),  # launches GPU work: the device interval is the GPU's
            step(3, 1, 100, 200),
            phase(4, "schedule", 100, 150, 3),  # nothing ran: no device interval
            step(5, 2, 200, 300),
            phase(6, "forward", 220, 260, 5),  # no GPU work: the device interval is this range
            step(7, 3, 300, 400),
            phase(8, "forward", 310, 390, 7),
        ],
         "nvtx_gpu_projection": [projection(1, 30, 60, 1), projection(2, 30, 60, 1),
                                 projection(7, 330, 370, 1), projection(8, 330, 370, 1)]},
        gpu_launch(1, 20, 30, 60),
        gpu_launch(2, 320, 330, 370),
    ))
    assert trace.query("host_gaps") == [
        (TID_A, 0, 2, 60, 220, 160),
        (TID_A, 2, 3, 260, 330, 70),
    ]
    # The forward range of step 2 ends at the gap's start: it touches the gap, no part of it.
    assert trace.query("host_gaps_parts") == [
        (TID_A, 2, "forward", 30),
        (TID_A, 2, "schedule", 50),
        (TID_A, 2, "unattributed", 80),
        (TID_A, 3, "forward", 20),
        (TID_A, 3, "unattributed", 50),
    ]


def test_unterminated_phase_covers_the_rest_of_the_gap(trace):
    trace.load(merge(
        {"nvtx_ranges": [
            step(1, 0, 0, 100),
            phase(2, "forward", 20, 70, 1),
            phase(3, "sample", 70, 80, 1),
            step(4, 1, 100, None),  # the capture stopped inside step 1's forward
            phase(5, "prepare", 100, 110, 4),
            phase(6, "forward", 110, None, 4),
        ],
         "nvtx_gpu_projection": [projection(4, 130, 140, 1), projection(6, 130, 140, 1)]},
        gpu_launch(1, 115, 130, 140),
    ))
    assert trace.query("host_gaps") == [(TID_A, 0, 1, 70, 130, 60)]
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "forward", 20),
        (TID_A, 1, "prepare", 10),
        (TID_A, 1, "sample", 10),
        (TID_A, 1, "unattributed", 20),
    ]


def test_each_thread_is_its_own_track(trace):
    trace.load({"nvtx_ranges": [
        step(1, 0, 0, 100, tid=TID_A),
        step(2, 0, 5, 105, tid=TID_C),  # another process, numbering its own iterations
        phase(3, "forward", 10, 50, 1, tid=TID_A),
        phase(4, "forward", 20, 60, 2, tid=TID_C),
        push_pop(5, "schedule", 50, 150, tid=TID_B),  # a thread with no steps: no part in any gap
        step(6, 1, 100, 200, tid=TID_A),
        phase(7, "schedule", 100, 130, 6, tid=TID_A),
        step(8, 1, 105, 205, tid=TID_C),
        phase(9, "forward", 130, 180, 6, tid=TID_A),
        phase(10, "forward", 150, 190, 8, tid=TID_C),
    ]})
    assert trace.query("host_gaps") == [
        (TID_A, 0, 1, 50, 130, 80),
        (TID_C, 0, 1, 60, 150, 90),
    ]
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "schedule", 30),
        (TID_A, 1, "unattributed", 50),
        (TID_C, 1, "unattributed", 90),
    ]


def test_generic_mapping_names_phases_by_text_with_digits_as_hash(trace):
    ops = r"^decode_step_(\d+)$"
    trace.load(merge(
        {"nvtx_ranges": [
            push_pop(1, "decode_step_0", 0, 100, domain=None),
            push_pop(2, "aten::mul, op_id = 1", 10, 40, parent=1, depth=1, domain=None),
            push_pop(3, "aten::add, op_id = 2", 40, 60, parent=1, depth=1, domain=None),  # has a child: no part
            push_pop(4, "aten::empty, op_id = 3", 45, 50, parent=3, depth=2, domain=None),
            push_pop(5, "decode_step_1", 100, 200, domain=None),
            push_pop(6, "aten::mul, op_id = 4", 120, 140, parent=5, depth=1, domain=None),
            push_pop(7, "aten::mul, op_id = 6", 180, 190, domain=None),  # between steps, on the track
            push_pop(8, "decode_step_2", 300, 400, domain=None),
            push_pop(9, "aten::mul, op_id = 5", 300, 320, parent=8, depth=1, domain=None),
        ],
         "nvtx_gpu_projection": [projection(1, 30, 50, 1), projection(5, 150, 160, 1),
                                 projection(8, 330, 340, 1)]},
        gpu_launch(1, 20, 30, 50),
        gpu_launch(2, 125, 150, 160),
        gpu_launch(3, 305, 330, 340),
    ))
    params = {"preset": "generic", "step_pattern": ops, "iteration_from": "text"}
    assert trace.query("host_gaps", params) == [
        (TID_A, 0, 1, 50, 150, 100),
        (TID_A, 1, 2, 160, 330, 170),
    ]
    assert trace.query("host_gaps_parts", params) == [
        (TID_A, 1, "aten::mul, op_id = #", 20),
        (TID_A, 1, "unattributed", 80),
        (TID_A, 2, "aten::mul, op_id = #", 30),
        (TID_A, 2, "unattributed", 140),
    ]


@pytest.mark.parametrize("forward_end", [190, None], ids=["ends_after_the_gap", "unterminated"])
def test_gap_inside_one_phase_is_all_that_phase(trace, forward_end):
    # Step 0's kernel runs on to 120, inside step 1's forward; step 1's kernel starts at 160, still
    # inside it: the whole gap [120, 160) lies in one leaf, which takes the gap's length, not its own.
    trace.load(merge(
        {"nvtx_ranges": [
            step(1, 0, 0, 100),
            phase(2, "forward", 10, 90, 1),
            step(3, 1, 100, None if forward_end is None else 200),
            phase(4, "schedule", 100, 110, 3),
            phase(5, "forward", 110, forward_end, 3),
        ],
         "nvtx_gpu_projection": [projection(1, 30, 120, 1), projection(2, 30, 120, 1),
                                 projection(3, 160, 170, 1), projection(5, 160, 170, 1)]},
        gpu_launch(1, 20, 30, 120),
        gpu_launch(2, 150, 160, 170),
    ))
    assert trace.query("host_gaps") == [(TID_A, 0, 1, 120, 160, 40)]
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "forward", 40),
        (TID_A, 1, "unattributed", 0),
    ]


@pytest.mark.parametrize("inner, forward_ns", [
    # a sample inside step 2's forward that starts after the gap [120, 250) ended: forward is still no leaf,
    # so its part of the gap, 220..250, is unattributed and forward keeps 120..150 of step 1's forward only
    ((260, 270), 30),
    # a sample of no length at the very start of step 2's forward (a phase that took under the clock's
    # tick) holds nothing and lies inside nothing: forward stays a leaf, 120..150 and 220..250
    ((220, 220), 60),
], ids=["later", "no_length"])
def test_a_phase_is_a_leaf_unless_a_phase_of_some_length_lies_inside_it(trace, inner, forward_ns):
    tables = {**GPU_THREE_STEPS, "nvtx_ranges": GPU_THREE_STEPS["nvtx_ranges"] + [
        phase(12, "sample", *inner, 11, depth=2)]}
    trace.load(tables)
    assert trace.query("host_gaps_parts") == [
        (TID_A, 1, "unattributed", 0),
        (TID_A, 2, "forward", forward_ns),
        (TID_A, 2, "sample", 40),
        (TID_A, 2, "schedule", 20),
        (TID_A, 2, "unattributed", 130 - forward_ns - 40 - 20),
    ]


def test_phase_names_in_other_domains_take_no_part(trace):
    # A library's range named like a phase: inside step 1's schedule it leaves schedule a leaf, and
    # between the steps it covers nothing.
    trace.load({"nvtx_ranges": CPU_TWO_STEPS["nvtx_ranges"] + [
        push_pop(12, "sample", 98, 100, domain="torch"),
        push_pop(13, "schedule", 102, 105, parent=9, depth=2, domain="torch"),
    ]})
    assert trace.query("host_gaps_parts") == CPU_TWO_STEPS_PARTS


@pytest.mark.parametrize("tables", [CPU_TWO_STEPS, GPU_THREE_STEPS], ids=["cpu", "gpu"])
def test_parts_add_up_to_each_gap(trace, tables):
    trace.load(tables)
    assert parts_by_gap(trace) == gap_lengths(trace)


def test_gaps_of_unnumbered_steps_are_kept_apart(trace):
    # Steps without a payload have no iteration number: their gaps are still split one by one.
    # Gap [70, 120): sample 10, postprocess 18, 2 between steps, schedule 15, prepare 5.
    # Gap [170, 210): sample 15, 15 between steps, schedule 10.
    trace.load({"nvtx_ranges": [
        step(1, None, 0, 100),
        phase(2, "schedule", 0, 10, 1), phase(3, "prepare", 10, 20, 1), phase(4, "forward", 20, 70, 1),
        phase(5, "sample", 70, 80, 1), phase(6, "postprocess", 80, 98, 1),
        step(7, None, 100, 200),
        phase(8, "schedule", 100, 115, 7), phase(9, "prepare", 115, 120, 7), phase(10, "forward", 120, 170, 7),
        phase(11, "sample", 170, 185, 7),
        step(12, None, 200, 300),
        phase(13, "schedule", 200, 210, 12), phase(14, "forward", 210, 260, 12),
    ]})
    assert trace.query("host_gaps_parts") == sorted([  # (query returns rows sorted)
        (TID_A, None, "postprocess", 18), (TID_A, None, "prepare", 5), (TID_A, None, "sample", 10),
        (TID_A, None, "schedule", 15), (TID_A, None, "unattributed", 2),
        (TID_A, None, "sample", 15), (TID_A, None, "schedule", 10), (TID_A, None, "unattributed", 15),
    ], key=lambda row: (row[2], row[3]))
    assert trace.query("host_gaps_worst") == [
        (1, TID_A, None, None, 50, "postprocess", 18),
        (2, TID_A, None, None, 40, "sample", 15),  # sample and unattributed tie: the first by name
    ]
    by_phase = {row[0]: row[1:4] for row in trace.query("host_gaps_by_phase")}  # phase: gaps, with it, total
    assert by_phase["sample"] == (2, 2, 25) and by_phase["unattributed"] == (2, 2, 17)


def test_summary_per_track(trace):
    trace.load(GPU_THREE_STEPS)
    # Gaps 0 and 130 over 30..290; launch latencies 10, 5 and 20.
    assert trace.query("host_gaps_summary") == [(TID_A, 3, 2, 260, 130, 0.5, 0, 130, 130, 130, 10)]


def test_by_phase_over_all_gaps(trace):
    trace.load(GPU_THREE_STEPS)
    # (phase, gaps, gaps_with_phase, total_ns, share, mean_ns, p50_ns, p90_ns, p99_ns, max_ns)
    assert trace.query("host_gaps_by_phase") == [
        ("forward", 2, 1, 60, 60 / 130, 30.0, 0, 60, 60, 60),
        ("sample", 2, 1, 40, 40 / 130, 20.0, 0, 40, 40, 40),
        ("schedule", 2, 1, 20, 20 / 130, 10.0, 0, 20, 20, 20),
        ("unattributed", 2, 1, 10, 10 / 130, 5.0, 0, 10, 10, 10),
    ]


def test_worst_gaps_with_their_top_phase(trace):
    trace.load(GPU_THREE_STEPS)
    # (rank, global_tid, prev_iteration, iteration, gap_ns, top_phase, top_phase_ns)
    assert trace.query("host_gaps_worst") == [
        (1, TID_A, 0, 2, 130, "forward", 60),
        (2, TID_A, 0, 1, 0, "unattributed", 0),
    ]
    assert trace.query("host_gaps_worst", {"limit": "1"}) == [(1, TID_A, 0, 2, 130, "forward", 60)]


def test_a_phase_named_unattributed_is_no_phase(trace):
    """A range whose phase name would be `unattributed` (the generic preset takes every range as a phase)
    leaves its time in the gap's one unattributed part, instead of a second part of that name."""
    trace.load({"nvtx_ranges": [push_pop(1, "it_0", 0, 100, domain="d"),
                                push_pop(2, "unattributed", 30, 50, parent=1, depth=1, domain="d"),
                                push_pop(3, "sample", 50, 60, parent=1, depth=1, domain="d"),
                                push_pop(4, "it_1", 100, 200, domain="d")],
                "nvtx_gpu_projection": [projection(1, 0, 20, 1), projection(4, 120, 130, 1)]})
    params = {"preset": "generic", "step_pattern": "^it_", "iteration_from": "order",
              "phase_pattern": "^(sample|unattributed)$"}
    assert trace.query("host_gaps_parts", params) == [(TID_A, 1, "sample", 10), (TID_A, 1, "unattributed", 90)]
    assert [row[:3] for row in trace.query("host_gaps_by_phase", params)] == [("sample", 1, 1), ("unattributed", 1, 1)]
    assert trace.query("host_gaps_worst", params) == [(1, TID_A, 0, 1, 100, "unattributed", 90)]


def test_worst_gaps_of_equal_length_rank_by_track_then_iteration(trace):
    # Gaps of 80 on both tracks: track A's two (iterations 1 and 2) first, then track C's.
    ranges = []
    for tid, steps in ((TID_C, 2), (TID_A, 3)):
        for iteration in range(steps):
            base = len(ranges) + 1
            ranges.append(step(base, iteration, 100 * iteration, 100 * iteration + 100, tid=tid))
            ranges.append(phase(base + 1, "forward", 100 * iteration + 10, 100 * iteration + 30, base, tid=tid))
    trace.load({"nvtx_ranges": ranges})
    assert trace.query("host_gaps_worst") == [
        (1, TID_A, 0, 1, 80, "unattributed", 80),
        (2, TID_A, 1, 2, 80, "unattributed", 80),
        (3, TID_C, 0, 1, 80, "unattributed", 80),
    ]


# Random steps of 100 ns, each holding phase ranges at random places, some with a phase range
# inside them, each step with a random device interval (GPU projection) that may overlap the others'.
PHASE_NAMES = ("schedule", "prepare", "forward", "sample")


@st.composite
def random_run(draw) -> dict[str, list[dict]]:
    ranges: list[dict] = []
    device: list[dict] = []
    for iteration in range(draw(st.integers(1, 5))):
        base = iteration * 100
        step_id = len(ranges) + 1
        ranges.append(step(step_id, iteration, base, base + 100))
        cuts = sorted(draw(st.sets(st.integers(base, base + 100), max_size=8)))
        for start, end in zip(cuts[::2], cuts[1::2]):
            outer_id = len(ranges) + 1
            ranges.append(phase(outer_id, draw(st.sampled_from(PHASE_NAMES)), start, end, step_id))
            if draw(st.booleans()):
                inner_start = draw(st.integers(start, end - 1))
                inner_end = draw(st.integers(inner_start + 1, end))
                ranges.append(phase(len(ranges) + 1, draw(st.sampled_from(PHASE_NAMES)), inner_start, inner_end,
                                    outer_id, depth=2))
        gpu_start = draw(st.integers(base, base + 150))
        device.append(projection(step_id, gpu_start, gpu_start + draw(st.integers(0, 80)), 1))
    return {"nvtx_ranges": ranges, "nvtx_gpu_projection": device}


def parts_by_counting(tables: dict[str, list[dict]], gaps: list[tuple]) -> list[tuple]:
    """host_gaps_parts computed instant by instant: the leaf (a phase range no other is inside) holding each, if any."""
    phases = [r for r in tables["nvtx_ranges"] if r["text"] != "step"]
    parents = {r["parent_range_id"] for r in phases}
    leaves = [r for r in phases if r["range_id"] not in parents]
    out = []
    for tid, _, iteration, start_ns, end_ns, _ in gaps:
        counts = Counter({"unattributed": 0})
        for t in range(start_ns, end_ns):
            holder = [r["text"] for r in leaves if r["start_ns"] <= t < r["end_ns"]]
            counts[holder[0] if holder else "unattributed"] += 1
        out.extend((tid, iteration, name, n) for name, n in counts.items())
    return sorted(out)


@settings(max_examples=20, deadline=None)
@given(tables=random_run())
def test_parts_match_an_instant_by_instant_count(trace, tables):
    trace.load(tables)
    assert trace.query("host_gaps_parts") == parts_by_counting(tables, trace.query("host_gaps"))
