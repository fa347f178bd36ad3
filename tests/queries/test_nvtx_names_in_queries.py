"""The NVTX names the engine emits (profiler/tracing/nvtx_ranges.py, defined once) are the names the queries read.

The SQL cannot import Python, so this test holds the two together: the mapping preset's macros,
evaluated in DuckDB, and every NVTX name any query compares with, against nvtx_ranges' exports.
"""
from __future__ import annotations

import re
from pathlib import Path

import duckdb

from itertrace.profiler.tracing import nvtx_ranges as nv
from itertrace.queries.presets import module_sql

QUERIES = Path(__file__).resolve().parents[2] / "queries"
MARKS = {nv.ARRIVE, nv.FINISH, nv.ADMIT, nv.TOKENS}


def test_the_itertrace_preset_matches_the_engines_ranges():
    con = duckdb.connect()
    con.execute(module_sql())  # the presets' macros, which mapping.sql reads
    con.execute((QUERIES / "mapping.sql").read_text())
    domain, step, phases, device = con.execute(
        "SELECT mapping_domain(), mapping_step_pattern(), mapping_phase_pattern(), mapping_device_pattern()").fetchone()
    assert domain == nv.DOMAIN
    names = [nv.STEP, *nv.PHASES, *MARKS]
    full = lambda pattern, text: bool(re.fullmatch(pattern.strip("^$"), text))  # noqa: E731 (anchored patterns)
    assert [n for n in names if full(step, n)] == [nv.STEP]
    assert [n for n in names if full(phases, n)] == list(nv.PHASES)
    assert [n for n in names if full(device, n)] == [nv.PhaseName.FORWARD.value]
    # the phase a range stands for is its own name (the pattern's capture group)
    got = con.execute("SELECT list(mapping_phase_name(p)) FROM unnest(?::VARCHAR[]) t(p)", [list(nv.PHASES)]).fetchone()
    assert got[0] == list(nv.PHASES)


def test_every_nvtx_name_a_query_compares_with_is_one_the_engine_emits():
    seen = set()
    for sql in sorted(QUERIES.glob("*.sql")):
        text = sql.read_text()
        for domain in re.findall(r"domain_name\s*=\s*'([^']*)'", text):
            assert domain == nv.DOMAIN, f"{sql.name}: domain {domain!r}"
        for name in re.findall(r"\btext\s*(?:=|LIKE)\s*'([^' %]*)", text):
            assert name in MARKS | {nv.STEP, *nv.PHASES}, f"{sql.name}: NVTX name {name!r}"
            seen.add(name)
    assert {nv.ARRIVE, nv.ADMIT, nv.TOKENS} <= seen  # the scan finds what request_latency.sql reads
