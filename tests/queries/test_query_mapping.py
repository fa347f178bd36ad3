"""Diff tests of queries/mapping.sql: the mapping row, presets and overrides, phase names, iteration numbers."""
from __future__ import annotations

import pytest
from query_fixtures import TID_A, TID_B, push_pop

from itertrace.errors import UserError

ITERTRACE_PHASES = "^(schedule|prepare|forward|sample|detokenize|postprocess)$"
DECODE_STEP = r"^decode_step_(\d+)$"
NUMBERING = "SELECT iteration, global_tid, step_range_id FROM iterations"

# Another engine's steps, `decode_step_N`, on two threads, numbered out of start order, in two domains.
DECODE_STEPS = {"nvtx_ranges": [
    push_pop(1, "decode_step_7", 100, 200, tid=TID_A, domain=None),
    push_pop(2, "decode_step_5", 150, 260, tid=TID_B, domain="engine"),
    push_pop(3, "decode_step_8", 200, 300, tid=TID_A, domain=None),
    push_pop(4, "prefill_step_6", 300, 400, tid=TID_A, domain=None),  # another range
    push_pop(5, "decode_step_6", 300, 420, tid=TID_B, domain="engine"),
    push_pop(6, "decode_step_9_x", 400, 500, tid=TID_A, domain=None),  # the pattern is anchored
]}


def test_default_mapping_is_the_itertrace_preset(trace):
    assert trace.load().query("mapping") == [
        ("itertrace", "^step$", "itertrace", ITERTRACE_PHASES, "^forward$", "payload")]


def test_generic_preset_needs_a_step_pattern(trace):
    with pytest.raises(UserError, match="parameter step_pattern is missing"):
        trace.load().query("mapping", {"preset": "generic"})


def test_generic_preset_numbers_by_order_in_any_domain_with_no_phases_or_device_range(trace):
    assert trace.load().query("mapping", {"preset": "generic", "step_pattern": DECODE_STEP}) == [
        ("generic", DECODE_STEP, None, "", None, "order")]


def test_parameters_override_the_itertrace_preset(trace):
    params = {"domain": "", "phase_pattern": "^phase_(.*)$", "device_pattern": "", "iteration_from": "text"}
    assert trace.load().query("mapping", params) == [("itertrace", "^step$", None, "^phase_(.*)$", None, "text")]


def test_parameters_override_the_generic_preset(trace):
    params = {"preset": "generic", "step_pattern": "^s$", "domain": "engine", "device_pattern": "^gpu$"}
    assert trace.load().query("mapping", params) == [("generic", "^s$", "engine", "", "^gpu$", "order")]


def test_iteration_from_must_be_payload_text_or_order(trace):
    with pytest.raises(UserError, match="iteration_from must be one of payload, text, order"):
        trace.load().query("mapping", {"iteration_from": "position"})


def test_phase_name_is_the_text_with_digits_as_hash_where_the_pattern_captures_nothing(trace):
    names = ("SELECT mapping_phase_name('forward'), mapping_phase_name('aten::mul, op_id = 12'),"
             " mapping_phase_name('layers.3.mlp_12')")
    assert trace.load().sql(names) == [("forward", "aten::mul, op_id = #", "layers.#.mlp_#")]  # every run of digits


def test_phase_name_is_the_patterns_first_capture_group(trace):
    names = "SELECT mapping_phase_name('phase_sample_3'), mapping_phase_name('other_3')"
    assert trace.load().sql(names, {"phase_pattern": r"^phase_(\w+)_\d+$"}) == [("sample", "other_#")]


def test_generic_steps_numbered_from_their_text(trace):
    params = {"preset": "generic", "step_pattern": DECODE_STEP, "iteration_from": "text"}
    assert trace.load(DECODE_STEPS).sql(NUMBERING, params) == [
        (5, TID_B, 2), (6, TID_B, 5), (7, TID_A, 1), (8, TID_A, 3)]


def test_generic_steps_numbered_by_start_order_on_each_thread(trace):
    params = {"preset": "generic", "step_pattern": DECODE_STEP, "iteration_from": "order"}
    assert trace.load(DECODE_STEPS).sql(NUMBERING, params) == [
        (0, TID_A, 1), (0, TID_B, 2), (1, TID_A, 3), (1, TID_B, 5)]


def test_generic_steps_of_one_domain(trace):
    params = {"preset": "generic", "step_pattern": DECODE_STEP, "iteration_from": "text", "domain": "engine"}
    assert trace.load(DECODE_STEPS).sql(NUMBERING, params) == [(5, TID_B, 2), (6, TID_B, 5)]


def test_generic_steps_without_a_number_in_their_text_have_none(trace):
    params = {"preset": "generic", "step_pattern": r"^decode_step_(\d+|x)$", "iteration_from": "text"}
    tables = {"nvtx_ranges": [push_pop(1, "decode_step_x", 0, 10, domain=None),
                              push_pop(2, "decode_step_3", 10, 20, domain=None)]}
    assert trace.load(tables).sql(NUMBERING, params) == [(3, TID_A, 2), (None, TID_A, 1)]


def test_itertrace_steps_numbered_by_payload_in_the_itertrace_domain_only(trace):
    tables = {"nvtx_ranges": [
        push_pop(1, "step", 0, 10, payload=41),
        push_pop(2, "step", 10, 20, payload=40),  # payloads need not follow start order
        push_pop(3, "step", 20, 30, payload=99, domain=None),  # default domain: not this engine's step
        push_pop(4, "steps", 30, 40, payload=98),
    ]}
    assert trace.load(tables).sql(NUMBERING) == [(40, TID_A, 2), (41, TID_A, 1)]


def test_a_range_that_launched_no_gpu_work_is_never_suggested_on_a_gpu_capture(tmp_path, capsys):
    """Collective ranges on another thread repeat like an iteration, but launch none of the capture's GPU work:
    suggest offers no line for them (following it gave host gaps of 99.9% beside 6.5% idle between iterations),
    and says why; auto then finds no iteration."""
    from query_fixtures import TID_B, api_call, gpu_op, make_db, push_pop

    from itertrace.cli import main

    tables = {"nvtx_ranges": [push_pop(i + 1, "nccl:_all_gather_base", 100 * i, 100 * i + 50, tid=TID_B, domain=None)
                              for i in range(6)],
              "cuda_api": [api_call(1, 10, 12, correlation_id=1)],
              "gpu_ops": [{**gpu_op(1, 20, 400, correlation_id=1), "device_id": 0}]}
    db = make_db(tmp_path / "capture.duckdb", tables)
    assert main(["mapping", "suggest", "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    assert out == ("none fits: 1 range names repeat at least 4 times, but no range of them launched any of the "
                   "capture's GPU work, as an iteration's range does (it launches the step's kernels); if you know "
                   "the range that is one iteration, map it with --param preset=generic --param step_pattern=...\n")
    assert err.startswith("itertrace: mapping: auto found no range that repeats like an iteration")
