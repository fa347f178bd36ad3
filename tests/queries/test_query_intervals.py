"""Tests of queries/intervals.sql: exact rows on small inputs, and agreement with a count of the instants
each interval covers (intervals of whole nanoseconds, so an instant is one integer)."""
from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from itertrace.queries.catalog import modules
from itertrace.queries.library import create

MIN_NS = -9223372036854775808
MAX_NS = 9223372036854775807


@pytest.fixture(scope="module")
def con():
    """A connection with the intervals macros and nothing else."""
    con = duckdb.connect()
    create(con, next(m for m in modules() if m.name == "intervals").definitions, {})
    yield con
    con.close()


def load(con: duckdb.DuckDBPyConnection, name: str, columns: str, rows: list[tuple]) -> None:
    """Replace table `name` (columns as in CREATE TABLE) by `rows`."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({columns})")
    if rows:
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return sorted(con.execute(sql).fetchall())


SPANS = "key INTEGER, start_ns BIGINT, end_ns BIGINT"


def test_leaves_are_the_ranges_that_hold_no_other(con):
    load(con, "ranges", "key INTEGER, id INTEGER, start_ns BIGINT, end_ns BIGINT, phase VARCHAR", [
        # key 1: 1 holds 2 and 4, 2 holds 3; 5 and 6 start together (longest first): 5 holds 6
        (1, 1, 0, 100, "step"), (1, 2, 10, 50, "prepare"), (1, 3, 20, 30, "sample"), (1, 4, 50, 90, "forward"),
        (1, 5, 200, 300, "outer"), (1, 6, 200, 250, "inner"),
        # two ranges alike: the first by id holds the second
        (1, 8, 400, 410, "twin"), (1, 7, 400, 410, "twin"),
        # a range of no length is none, even at the start of another; one that ends where the next starts
        # holds nothing
        (1, 9, 500, 500, "empty"), (1, 17, 500, 520, "after empty"), (1, 10, 600, 650, "a"), (1, 11, 650, 700, "b"),
        # key 2: an open range holds what starts after it, and what starts with it; the last is a leaf
        (2, 12, 0, None, "open"), (2, 13, 5, 10, "inside"), (2, 14, 20, None, "open"), (2, 15, 20, 25, "with it"),
        (3, 16, 0, None, "open, last"),
    ])
    assert rows(con, "SELECT key, id, start_ns, end_ns, phase FROM intervals_leaves(ranges)") == [
        (1, 3, 20, 30, "sample"), (1, 4, 50, 90, "forward"), (1, 6, 200, 250, "inner"), (1, 8, 400, 410, "twin"),
        (1, 10, 600, 650, "a"), (1, 11, 650, 700, "b"), (1, 17, 500, 520, "after empty"),
        (2, 13, 5, 10, "inside"), (2, 15, 20, 25, "with it"), (3, 16, 0, None, "open, last"),
    ]


def test_leaves_keep_every_column_of_their_rows(con):
    load(con, "ranges", "key INTEGER, id INTEGER, start_ns BIGINT, end_ns BIGINT, phase_rank INTEGER, pid BIGINT", [
        (1, 1, 0, 10, 3, 7)])
    assert con.execute("SELECT * FROM intervals_leaves(ranges)").fetchall() == [(1, 1, 0, 10, 3, 7)]
    assert [c[0] for c in con.description] == ["key", "id", "start_ns", "end_ns", "phase_rank", "pid"]


def test_union_is_disjoint_islands_per_key(con):
    load(con, "spans", SPANS, [
        (1, 0, 10), (1, 5, 8), (1, 8, 20),  # overlapping and inside: one island
        (1, 20, 25),                        # touching: the same island
        (1, 30, 30),                        # empty: no part
        (1, 40, 50), (1, 45, 60),
        (2, 0, 10), (2, 11, 12),            # another key: its own islands
    ])
    assert rows(con, "SELECT * FROM intervals_union(spans)") == [(1, 0, 25), (1, 40, 60), (2, 0, 10), (2, 11, 12)]


def test_complement_is_what_the_union_leaves_within_the_bounds(con):
    load(con, "spans", SPANS, [(1, 10, 20), (1, 15, 30), (1, 40, 50), (2, -5, 5), (2, 95, 200), (3, 0, 100)])
    assert rows(con, "SELECT * FROM intervals_complement(spans, 0, 100)") == [
        (1, 0, 10), (1, 30, 40), (1, 50, 100), (2, 5, 95)]  # key 3 covers the bounds: nothing
    assert rows(con, f"SELECT * FROM intervals_complement(spans, {MIN_NS}, {MAX_NS}) WHERE key = 1") == [
        (1, MIN_NS, 10), (1, 30, 40), (1, 50, MAX_NS)]


def test_intersect_gives_each_overlap_with_both_sides_columns(con):
    load(con, "gaps", "key INTEGER, start_ns BIGINT, end_ns BIGINT, gap INTEGER", [
        (1, 0, 10, 1), (1, 20, 30, 2), (1, 40, 50, 3), (1, 60, 70, 4), (2, 0, 100, 5)])
    load(con, "leaves", "key INTEGER, start_ns BIGINT, end_ns BIGINT, phase VARCHAR", [
        (1, 5, 25, "a"),     # starts inside gap 1, holds gap 2's start
        (1, 27, 28, "b"),    # inside gap 2
        (1, 35, 40, "c"),    # ends where gap 3 starts: no overlap
        (1, 40, 45, "d"),    # starts with gap 3
        (1, 65, 65, "e"),    # empty, inside gap 4: an empty overlap
        (3, 0, 100, "f"),    # a key without gaps
    ])
    got = con.execute("SELECT * FROM intervals_intersect(gaps, leaves)")
    assert [c[0] for c in got.description] == ["key", "gap", "phase", "start_ns", "end_ns"]
    assert sorted(got.fetchall()) == [
        (1, 1, "a", 5, 10), (1, 2, "a", 20, 25), (1, 2, "b", 27, 28), (1, 3, "d", 40, 45), (1, 4, "e", 65, 65)]


def test_cuts_split_at_every_start_and_end(con):
    load(con, "spans", SPANS, [(1, 0, 10), (1, 5, 20), (1, 30, 40), (2, 7, 9)])
    assert rows(con, "SELECT * FROM intervals_cuts(spans)") == [
        (1, 0, 5), (1, 5, 10), (1, 10, 20), (1, 20, 30), (1, 30, 40), (2, 7, 9)]


def test_macros_read_a_cte_by_name(con):
    assert rows(con, "WITH s AS (SELECT * FROM (VALUES (1, 0, 5), (1, 3, 9)) t(key, start_ns, end_ns)) "
                     "SELECT * FROM intervals_union(s)") == [(1, 0, 9)]


# -- agreement with a count of covered instants, on random intervals of two keys in [0, 40)

intervals = st.lists(st.tuples(st.integers(1, 2), st.integers(0, 39), st.integers(0, 12)), max_size=12).map(
    lambda xs: [(k, s, min(s + d, 40)) for k, s, d in xs])


def covered(spans: list[tuple]) -> set[tuple[int, int]]:
    """The (key, instant) pairs the intervals cover."""
    return {(k, t) for k, s, e in spans for t in range(s, e)}


def runs(points: set[tuple[int, int]]) -> list[tuple]:
    """The maximal runs of consecutive instants per key, as (key, start, end)."""
    out = []
    for k, t in sorted(points):
        if out and out[-1][0] == k and out[-1][2] == t:
            out[-1] = (k, out[-1][1], t + 1)
        else:
            out.append((k, t, t + 1))
    return out


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(intervals, intervals, st.integers(-5, 20), st.integers(20, 45))
def test_union_complement_intersect_agree_with_instants(con, a, b, lo, hi):
    load(con, "a", SPANS, a)
    load(con, "b", SPANS, b)
    union_a, union_b = runs(covered(a)), runs(covered(b))
    assert rows(con, "SELECT * FROM intervals_union(a)") == union_a
    keys = {k for k, _, _ in union_a}
    bounds = {(k, t) for k in keys for t in range(lo, hi)}
    assert rows(con, f"SELECT * FROM intervals_complement(a, {lo}, {hi})") == runs(bounds - covered(a))
    # the intersection of the two unions, as disjoint sets: each overlap is one run of common instants
    load(con, "ua", SPANS, union_a)
    load(con, "ub", SPANS, union_b)
    assert rows(con, "SELECT * FROM intervals_intersect(ua, ub)") == runs(covered(a) & covered(b))


nested = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10)), max_size=14)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(nested)
def test_leaves_agree_with_holding_no_other_range(con, drawn):
    # keep the ranges that nest with or stay apart from every range kept before: push/pop ranges
    kept: list[tuple[int, int, int]] = []
    for i, (s, d) in enumerate(drawn):
        e = s + d
        if all(e <= s2 or e2 <= s or (s <= s2 and e2 <= e) or (s2 <= s and e <= e2) for _, s2, e2 in kept):
            kept.append((i, s, e))
    load(con, "ranges", "key INTEGER, id INTEGER, start_ns BIGINT, end_ns BIGINT", [(1, i, s, e) for i, s, e in kept])

    def holds(r, q):  # r holds q: q comes after r (start, longest first, id) and lies inside it
        return (r[1], -r[2], r[0]) < (q[1], -q[2], q[0]) and r[1] <= q[1] and q[2] <= r[2]

    leaves = [(1, i, s, e) for i, s, e in kept if not any(holds((i, s, e), q) for q in kept)]
    assert rows(con, "SELECT key, id, start_ns, end_ns FROM intervals_leaves(ranges)") == sorted(leaves)
