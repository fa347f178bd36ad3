"""Benchmark (not a test): `itertrace fleet` over many captures, on Dask local clusters of 1 and 2 workers.

Makes `--captures` captures (default 1,000) by repeating the shared samples as the ranks of a few kinds of
server: PyTorch profiler traces rewritten as ranks 0-3 of 4 (their distributedInfo), and Nsight Systems
exports as nodes whose GPUs are the ranks. Then, each on a fresh LocalCluster, and the stages in turn:

- `ingest_fleet` with 1 and with 2 workers (two fleets), and `summarize_fleet` with 1 and 2 workers on the
  2-worker fleet: wall time of the call (cluster start apart), captures/s, each worker's peak RSS (its
  process's ru_maxrss, read on the worker at the end);
- the same summary computed in this process, one capture after another, without Dask, as a check: its rows
  must equal the 2-worker summary's (every table but the captures', which names the fleet's folders);
- with `--large-mb`, one PyTorch profiler trace of about that many MB (uncompressed JSON, the resnet sample
  repeated as benchmarks/bench_kineto.py does) ingested and summarized by one worker: MB/s per core, and
  that worker's peak RSS, the figures docs/fleet.md scales up from.

Usage: python benchmarks/bench_fleet.py [--captures 1000] [--large-mb 100] [--out DIR] [--keep]

Compare figures within one run of this script: wall times on a shared machine move with its load, which
the header and the footer print.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"
KINETO = ("kineto_samples/tiny_inference_rank1.json.gz", "kineto_samples/event_sync.json.gz",
          "kineto_samples/alexnet_sync.json.gz", "serving_traces/vllm_decode_full_graph_step.json.gz")
NSYS = ("nsys_samples/h100_2gpu_1s_pqtdir", "nsys_samples/arrow_2022.4/cupy.arrow")
RANKS = 4  # ranks of each traced server; servers and nsys nodes alternate: 1 capture in 5 is a node's
LARGE_SAMPLE = SHARED / "kineto_samples" / "resnet_v100_ns_rank0.json.gz"
COMPARED = ("ranks", "iterations", "groups", "skew", "stragglers", "failures")


@dataclass(frozen=True)
class Stage:
    """One measured stage."""

    name: str
    workers: str
    captures: int
    seconds: float
    start_s: float
    peak_rss_mb: list[float]

    @property
    def rate(self) -> float:
        return self.captures / self.seconds if self.seconds > 0 else float("inf")


def make_captures(folder: Path, count: int) -> dict[str, int]:
    """`count` captures under `folder`: traced servers of RANKS ranks and nsys nodes; counts by kind."""
    made = {"kineto": 0, "nsys": 0}
    documents = {s: json.loads(gzip.decompress((SHARED / s).read_bytes())) for s in KINETO}
    server = 0
    while sum(made.values()) < count:
        if server % 2:
            sample = SHARED / NSYS[(server // 2) % len(NSYS)]
            target = folder / f"node-{server:05d}" / sample.name
            target.parent.mkdir(parents=True)
            (shutil.copytree if sample.is_dir() else shutil.copy)(sample, target)
            made["nsys"] += 1
        else:
            document = documents[KINETO[(server // 2) % len(KINETO)]]
            for rank in range(min(RANKS, count - sum(made.values()))):
                document["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": RANKS}
                target = folder / f"server-{server:05d}" / f"rank-{rank}.json.gz"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(gzip.compress(json.dumps(document).encode(), compresslevel=1))
                made["kineto"] += 1
        server += 1
    return made


def _peak_rss_mb() -> float:
    """On a worker: its process's peak resident memory, MB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_stage(name: str, workers: int, work) -> tuple[Stage, object]:
    """Start a LocalCluster of `workers`, run `work(client)`, read each worker's peak RSS; (stage, result)."""
    from itertrace.fleet import ClusterOptions, fleet_client

    started = time.perf_counter()
    with fleet_client(ClusterOptions(workers=workers)) as client:
        ready = time.perf_counter()
        result = work(client)
        seconds = time.perf_counter() - ready
        peaks = sorted(client.run(_peak_rss_mb).values())
    return Stage(name, str(workers), 0, seconds, ready - started, peaks), result


def summary_rows(folder: Path) -> dict[str, list]:
    """Every compared table of a summary, its rows sorted."""
    out = {}
    with duckdb.connect() as con:
        for table in COMPARED:
            partials, reduced = folder / table, folder / f"{table}.parquet"
            if partials.is_dir():  # Hive-partitioned by capture and rank
                source = f"read_parquet('{partials}/**/*.parquet', hive_partitioning = true)"
            elif reduced.is_file():
                source = f"read_parquet('{reduced}')"
            else:  # a partial table no capture had rows of
                out[table] = []
                continue
            out[table] = con.execute(f"SELECT * FROM {source} ORDER BY ALL").fetchall()
    return out


def large_capture(out: Path, megabytes: int) -> tuple[Path, float]:
    """A PyTorch profiler trace of about `megabytes` MB; (its folder, its MB)."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from serving_captures import repeat  # copies shifted in time and ids, as the Kineto benchmark's trace

    per_copy_mb = len(gzip.decompress(LARGE_SAMPLE.read_bytes())) / 1e6
    folder = out / "large" / "server-0"
    folder.mkdir(parents=True)
    path = repeat(LARGE_SAMPLE, max(1, round(megabytes / per_copy_mb)), folder / "rank-0.json")
    return folder.parent, path.stat().st_size / 1e6


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=1000, help="captures in the fleet (default 1000)")
    parser.add_argument("--large-mb", type=int, default=100,
                        help="MB of the one large trace measured per core (default 100; 0: none)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/itertrace-bench-fleet"))
    parser.add_argument("--keep", action="store_true", help="keep the captures and fleets in --out")
    args = parser.parse_args(argv)
    missing = [s for s in (*KINETO, *NSYS) if not (SHARED / s).exists()]
    if missing:
        raise SystemExit(f"shared samples not found: {', '.join(missing)} (under {SHARED})")
    from itertrace.fleet import Fleet, QuerySettings, find_captures, ingest_fleet, new_or_existing, summarize_fleet
    from itertrace.fleet.layout import read_manifest

    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    load_before = loadavg()
    kinds = make_captures(args.out / "captures", args.captures)
    size_mb = sum(p.stat().st_size for p in (args.out / "captures").rglob("*") if p.is_file()) / 1e6
    captures = find_captures([args.out / "captures"])
    stages: list[Stage] = []
    fleets = {}
    for workers in (1, 2):
        fleet = new_or_existing(args.out / f"fleet-{workers}w")
        stage, result = run_stage("ingest", workers, lambda client: ingest_fleet(captures, fleet, client))
        assert result.failed == 0, read_manifest(fleet)
        stages.append(Stage(stage.name, stage.workers, result.ingested, stage.seconds, stage.start_s,
                            stage.peak_rss_mb))
        fleets[workers] = fleet
    fleet = fleets[2]
    ingest_s = sorted(e.ingest_s for e in read_manifest(fleets[1]).values())
    for workers in (1, 2):
        stage, result = run_stage("summary", workers, lambda client: summarize_fleet(fleet, client))
        stages.append(Stage(stage.name, stage.workers, result.summarized, stage.seconds, stage.start_s,
                            stage.peak_rss_mb))
    dask_rows = summary_rows(fleet.summary)
    here = Fleet(args.out / "fleet-here")
    shutil.copytree(fleet.root, here.root, ignore=shutil.ignore_patterns("summary", ".lock"))
    started = time.perf_counter()
    result = summarize_fleet(here, None, settings=QuerySettings())
    stages.append(Stage("summary", "this process", result.summarized, time.perf_counter() - started, 0.0,
                        [_peak_rss_mb()]))
    same = summary_rows(here.summary) == dask_rows

    print(f"bench_fleet: {args.captures:,} captures ({kinds['kineto']:,} PyTorch profiler traces as ranks 0-{RANKS - 1} "
          f"of {RANKS}-rank servers, {kinds['nsys']:,} Nsight Systems exports as nodes), {size_mb:,.0f} MB; "
          f"{os.cpu_count()} cores; load average before {load_before}")
    print(f"{'stage':8} {'workers':>12} {'captures':>8} {'wall s':>8} {'captures/s':>10} {'start s':>7} "
          f"{'peak RSS per worker MB':>24}")
    for s in stages:
        print(f"{s.name:8} {s.workers:>12} {s.captures:>8,} {s.seconds:8.1f} {s.rate:10.2f} {s.start_s:7.1f} "
              f"{', '.join(f'{mb:.0f}' for mb in s.peak_rss_mb):>24}")
    by = {(s.name, s.workers): s for s in stages}
    print(f"2 workers / 1 worker, captures/s: ingest {by['ingest', '2'].rate / by['ingest', '1'].rate:.2f}x, "
          f"summary {by['summary', '2'].rate / by['summary', '1'].rate:.2f}x; summary on 1 worker / in this "
          f"process: {by['summary', '1'].rate / by['summary', 'this process'].rate:.2f}x")
    print(f"per capture on 1 worker: ingest median {statistics.median(ingest_s):.2f} s (p90 "
          f"{ingest_s[int(0.9 * (len(ingest_s) - 1))]:.2f} s); summary {1 / by['summary', '1'].rate:.2f} s")
    print(f"the in-process summary's rows equal the 2-worker summary's: {'yes' if same else 'NO'} "
          f"({', '.join(f'{t} {len(r):,}' for t, r in dask_rows.items())})")
    if args.large_mb:
        folder, mb = large_capture(args.out, args.large_mb)
        big = new_or_existing(args.out / "fleet-large")
        found = find_captures([folder])
        ingest_stage, done = run_stage("ingest", 1, lambda client: ingest_fleet(found, big, client))
        summary_stage, _ = run_stage("summary", 1, lambda client: summarize_fleet(big, client))
        assert done.failed == 0, read_manifest(big)
        print(f"one {mb:,.0f} MB trace on 1 worker: ingest {ingest_stage.seconds:.1f} s ({mb / ingest_stage.seconds:.1f} "
              f"MB/s), peak RSS {ingest_stage.peak_rss_mb[0]:.0f} MB; summary {summary_stage.seconds:.1f} s "
              f"({mb / summary_stage.seconds:.1f} MB/s), peak RSS {summary_stage.peak_rss_mb[0]:.0f} MB")
    print(f"load average after {loadavg()}")
    if not args.keep:
        shutil.rmtree(args.out, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
