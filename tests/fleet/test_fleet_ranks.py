"""A fleet of ranks built so that known ranks are slowest on known iterations, run through `itertrace fleet` on the
default LocalCluster: skew, stragglers, groups and ranks come out as built, each from its own capture's clock.

server-0: four PyTorch profiler traces, ranks 0-3 of 4 (distributedInfo), rank 2 slowest on iterations 103 and
106, rank 1 on 108, rank 3 on 101; their clocks lie hours apart. server-1: two ranks of 2 with the same
iteration numbers, a group of its own. node-a: one nsys export of four processes, ranks by device id.
node-b: the same with NCCL ranks (device 3 - rank).
"""
from __future__ import annotations

import duckdb
import pyarrow.parquet as pq
import pytest
from fleet_captures import kineto_rank, nsys_node

from itertrace.cli import main
from itertrace.fleet import Fleet, QuerySettings, summarize_fleet

SERVER0 = {r: {i: 5_000 for i in range(100, 110)} for r in range(4)}  # µs per iteration
SERVER0[2][103], SERVER0[2][106], SERVER0[1][108], SERVER0[3][101] = 9_000, 8_000, 7_000, 5_500
SERVER1 = {r: {i: 3_000 for i in range(100, 105)} for r in range(2)}
SERVER1[0][102] = 3_400
NODE = {p: {i: 50_000 for i in range(1, 9)} for p in range(4)}  # ns per iteration
NODE[2][3], NODE[0][5] = 90_000, 60_000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet-ranks")
    captures = root / "in"
    for r, steps in SERVER0.items():
        kineto_rank(captures / "server-0" / f"rank-{r}.json.gz", r, 4, steps)
    for r, steps in SERVER1.items():
        kineto_rank(captures / "server-1" / f"rank-{r}.json.gz", r, 2, steps)
    nsys_node(captures / "node-a" / "report_pqtdir", NODE)
    nsys_node(captures / "node-b" / "report_pqtdir", NODE, nccl=True)
    out = root / "fleet"
    assert main(["fleet", "ingest", str(captures), "--out", str(out), "--quiet"]) == 0  # the default LocalCluster
    assert main(["fleet", "summary", str(out), "--quiet"]) == 0
    return Fleet(out)


def rows(fleet: Fleet, sql: str) -> list[tuple]:
    with duckdb.connect(str(fleet.summary / "fleet.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def expected_skew(group: str, steps: dict[int, dict[int, int]], unit_ns: int, name) -> list[tuple]:
    """fleet_skew's rows for one group, computed here from the times the captures were built with."""
    out = []
    for iteration in sorted(steps[0]):
        times = {rank: steps[rank][iteration] * unit_ns for rank in steps}
        ordered = sorted(times.values())
        slow, fast = max(ordered), min(ordered)
        straggler = min(r for r, t in times.items() if t == slow) if slow > fast else None
        fastest = min(r for r, t in times.items() if t == fast) if slow > fast else None
        out.append((group, iteration, len(times), fast, ordered[(len(ordered) - 1) // 2], slow, slow - fast,
                    straggler, name(straggler) if straggler is not None else None, fastest,
                    [{"rank": r, "capture": name(r), "iteration_ns": t} for r, t in sorted(times.items())]))
    return out


def test_skew_and_straggler_of_four_ranks(fleet):
    got = rows(fleet, """SELECT "group", iteration, ranks, fastest_ns, median_ns, slowest_ns, skew_ns, straggler_rank,
                                straggler_capture, fastest_rank, rank_times
                         FROM fleet_skew WHERE "group" = 'in/server-0' ORDER BY iteration""")
    assert got == expected_skew("in/server-0", SERVER0, 1_000, lambda r: f"in/server-0/rank-{r}.json.gz")
    slowest = {row[1]: row[7] for row in got}
    assert [i for i, rank in slowest.items() if rank == 2] == [103, 106]


def test_every_group_compares_only_its_own_ranks(fleet):
    assert rows(fleet, """SELECT "group", iteration, skew_ns, straggler_rank FROM fleet_skew
                          WHERE "group" = 'in/server-1' AND skew_ns > 0""") == [("in/server-1", 102, 400_000, 0)]
    for group, name in (("in/node-a/report_pqtdir", lambda r: "in/node-a/report_pqtdir"),
                        ("in/node-b", lambda r: "in/node-b/report_pqtdir")):
        got = rows(fleet, f"""SELECT "group", iteration, ranks, fastest_ns, median_ns, slowest_ns, skew_ns,
                                     straggler_rank, straggler_capture, fastest_rank, rank_times
                              FROM fleet_skew WHERE "group" = '{group}' ORDER BY iteration""")
        assert got == expected_skew(group, NODE, 1, name)


def test_stragglers_count_the_iterations_each_rank_was_slowest(fleet):
    assert rows(fleet, """SELECT rank, iterations, slowest, slowest_share, mean_behind_ns, max_skew_ns
                          FROM fleet_stragglers WHERE "group" = 'in/server-0'""") == [
        (2, 10, 2, 0.2, (4_000_000 + 3_000_000) / 10, 4_000_000),
        (1, 10, 1, 0.1, 2_000_000 / 10, 2_000_000),
        (3, 10, 1, 0.1, 500_000 / 10, 500_000),
        (0, 10, 0, 0.0, 0.0, None),
    ]


def test_groups_and_where_each_rank_comes_from(fleet):
    assert rows(fleet, "SELECT * FROM fleet_groups") == [
        ("in/node-a/report_pqtdir", None, 1, 4, None, [], 8, 8),
        ("in/node-b", 4, 1, 4, [], [], 8, 8),
        ("in/server-0", 4, 4, 4, [], [], 10, 10),
        ("in/server-1", 2, 2, 2, [], [], 5, 5),
    ]
    got = rows(fleet, """SELECT capture, rank, world_size, rank_source, device_id, iterations, iteration_p50_ns,
                                iteration_p99_ns FROM fleet_ranks WHERE capture LIKE 'in/node%' OR capture LIKE '%rank-2%'
                         ORDER BY capture, rank""")
    assert got == [
        *[("in/node-a/report_pqtdir", p, None, "device", p, 8, 50_000, max(NODE[p].values())) for p in range(4)],
        *[("in/node-b/report_pqtdir", p, 4, "nccl", 3 - p, 8, 50_000, max(NODE[p].values())) for p in range(4)],
        ("in/server-0/rank-2.json.gz", 2, 4, "distributed_info", 2, 10, 5_000_000, 9_000_000),
    ]


def test_the_partials_are_hive_partitioned_by_capture_and_rank(fleet):
    folders = sorted(p.relative_to(fleet.summary / "iterations").as_posix()
                     for p in (fleet.summary / "iterations").glob("*/*"))
    assert folders[:4] == [f"capture=in%2Fnode-a%2Freport_pqtdir/rank={r}" for r in range(4)]
    assert "capture=in%2Fserver-0%2Frank-2.json.gz/rank=2" in folders and len(folders) == 14
    files = list((fleet.summary / "iterations" / "capture=in%2Fserver-0%2Frank-2.json.gz" / "rank=2").iterdir())
    part = pq.read_table(files[0])
    assert "capture" not in part.column_names and part.column("iteration").to_pylist() == list(range(100, 110))


def test_the_views_are_documented_and_agree_with_the_parquet(fleet):
    with duckdb.connect(str(fleet.summary / "fleet.duckdb"), read_only=True) as con:
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        assert views == {"fleet_ranks", "fleet_iterations", "fleet_groups", "fleet_skew", "fleet_stragglers",
                         "fleet_captures", "fleet_failures"}
        undocumented = con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE NOT internal "
                                   "AND comment IS NULL").fetchall()
        assert undocumented == []
        skew = con.execute("SELECT * FROM fleet_skew ORDER BY ALL").fetchall()
        direct = con.execute(f"SELECT * FROM read_parquet('{fleet.summary / 'skew.parquet'}') ORDER BY ALL").fetchall()
    assert skew == direct and len(skew) == 10 + 5 + 8 + 8


def test_the_same_summary_in_one_process(fleet, tmp_path):
    """The reduction over the partials of tasks run here, one after another, gives the same rows."""
    import shutil

    copy = Fleet(tmp_path / "fleet")
    shutil.copytree(fleet.root, copy.root, ignore=shutil.ignore_patterns("summary", "reports", ".lock"))
    summarize_fleet(copy, None, settings=QuerySettings())
    for table in ("ranks", "iterations", "groups", "skew", "stragglers"):
        source = "read_parquet('{}/**/*.parquet', hive_partitioning = true)" if table in ("ranks", "iterations") \
            else "read_parquet('{}.parquet')"
        with duckdb.connect() as con:
            mine, theirs = (con.execute(f"SELECT * FROM {source.format(f.summary / table)} ORDER BY ALL").fetchall()
                            for f in (copy, fleet))
        assert mine == theirs and mine, table


def test_the_fleet_page_shows_ranks_skew_and_stragglers(fleet):
    page = fleet.root.parent / "fleet.html"
    assert main(["report", "--fleet", str(fleet.root), "-o", str(page), "--no-capture-reports", "--quiet"]) == 0
    text = page.read_text()
    for heading in ("Captures", "Ranks by busy share", "Idle causes across the fleet", "Skew between ranks, by iteration",
                    "Stragglers", "Groups of ranks", "Failures"):
        assert f"<h2>{heading}</h2>" in text
    assert "14 GPUs, the least busy first" in text and "The 9 iterations of largest skew" in text
    largest = text.index("The 9 iterations of largest skew")
    assert text.index("<td>in/server-0/rank-2.json.gz</td>", largest) < text.index("<td>in/server-0/rank-1.json.gz</td>",
                                                                                    largest)  # 4 ms before 2 ms
    assert "report</a>" not in text  # no capture's report was made
