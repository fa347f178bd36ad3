"""A fleet of 40 captures made by copying the shared real samples (PyTorch profiler traces of training and serving
runs, Nsight Systems exports), with three broken captures among them: the broken ones are reported and the rest
done, and for every capture the summary holds exactly the figures `itertrace query gpu_time_summary` gives for
its database."""
from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from itertrace.cli import main
from itertrace.fleet import Fleet
from itertrace.fleet.capture_summary import GPU_COLUMNS

SHARED = Path(__file__).parents[2] / ".." / "shared"
SAMPLES = (
    "kineto_samples/alexnet_sync.json.gz", "kineto_samples/amd_mi250_rocm62.json.gz",
    "kineto_samples/event_sync.json.gz", "kineto_samples/event_sync_multi_stream.json.gz",
    "kineto_samples/tiny_inference_rank1.json.gz", "kineto_samples/cpu_only_rank34.json.gz",
    "serving_traces/vllm_decode_full_graph_step.json.gz", "serving_traces/sglang_qwen3_8b_decode_step.json.gz",
    "nsys_samples/arrow_2022.4/cupy.arrow", "nsys_samples/h100_2gpu_1s_pqtdir",
)
COPIES = 4
TOO_NEW = SHARED / "nsys_samples" / "newer_nsys_rep" / "pytorch_lm_nsys2026.1.nsys-rep"

pytestmark = [
    pytest.mark.shared, pytest.mark.slow,
    pytest.mark.skipif(not all((SHARED / s).exists() for s in SAMPLES), reason=f"shared samples not found at {SHARED}"),
]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(fleet, the captures folder, stderr of its ingest)."""
    root = tmp_path_factory.mktemp("fleet-samples")
    captures = root / "in"
    for copy in range(COPIES):
        for sample in SAMPLES:
            source, target = SHARED / sample, captures / f"copy-{copy}" / Path(sample).name
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    broken = captures / "broken"
    broken.mkdir()
    whole = (SHARED / "kineto_samples" / "tiny_inference_rank1.json.gz").read_bytes()
    (broken / "truncated.json.gz").write_bytes(whole[: len(whole) // 2])
    (broken / "noise.arrow").write_bytes(bytes(range(256)) * 64)
    shutil.copy(TOO_NEW, broken / TOO_NEW.name)
    return Fleet(root / "fleet"), captures


def test_broken_captures_are_reported_and_the_rest_done(made, capsys):
    fleet, captures = made
    assert main(["fleet", "ingest", str(captures), "--out", str(fleet.root), "--workers", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"itertrace: fleet ingest: 40 of 43 captures in {fleet.root} (40 ingested, 0 done "
                              f"before); 3 failed ({fleet.failures}) in ")
    failed = pq.read_table(fleet.failures).to_pylist()
    assert [f["capture"] for f in failed] == [f"in/broken/{n}" for n in ("noise.arrow", TOO_NEW.name,
                                                                         "truncated.json.gz")]
    for row in failed:
        assert "\n" not in row["error"] and row["error"]
        assert f"itertrace: failed: {row['capture']}: {row['error']}" in err
    assert "truncated or corrupt gzip data" in failed[2]["error"]
    assert sorted(p.relative_to(fleet.root / "captures").as_posix() for p in (fleet.root / "captures").rglob("*")
                  if p.is_file()) == sorted(f"in/copy-{c}/{Path(s).name}.duckdb" for c in range(COPIES) for s in SAMPLES)


def test_a_second_run_skips_what_is_done_and_retries_what_failed(made, capsys):
    fleet, captures = made
    before = {p: p.stat().st_mtime_ns for p in (fleet.root / "captures").rglob("*.duckdb")}
    assert main(["fleet", "ingest", str(captures), "--out", str(fleet.root), "--workers", "2"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"itertrace: fleet ingest: 40 of 43 captures in {fleet.root} (0 ingested, 40 done before); 3 failed")
    assert {p: p.stat().st_mtime_ns for p in (fleet.root / "captures").rglob("*.duckdb")} == before


def test_each_capture_has_exactly_the_figures_of_its_own_query(made, tmp_path, capsys):
    fleet, _ = made
    assert main(["fleet", "summary", str(fleet.root), "--workers", "2", "--quiet"]) == 0
    with duckdb.connect(str(fleet.summary / "fleet.duckdb"), read_only=True) as con:
        ranks = con.sql(f"SELECT capture, {', '.join(GPU_COLUMNS)} FROM fleet_ranks WHERE device_id IS NOT NULL "
                        "ORDER BY capture, device_id, global_pid").to_arrow_table().to_pylist()
        failures = con.execute("SELECT capture, stage FROM fleet_failures").fetchall()
    assert len(failures) == 3 and {stage for _, stage in failures} == {"ingest"}
    by_capture: dict[str, list[dict]] = {}
    for row in ranks:
        by_capture.setdefault(row.pop("capture"), []).append(row)
    compared = 0
    for copy in range(COPIES):
        for sample in SAMPLES:
            name = f"in/copy-{copy}/{Path(sample).name}"
            out = tmp_path / f"{copy}-{Path(sample).name}.parquet"
            status = main(["query", "gpu_time_summary", "--db", str(fleet.database(name)), "--format", "parquet",
                           "--out", str(out)])
            err = capsys.readouterr().err
            if status == 2:  # a capture without GPU work: the query says so, and the fleet has no GPU row for it
                assert "no GPU work in this capture" in err and name not in by_capture
                continue
            assert status == 0, err
            expected = pq.read_table(out)
            assert tuple(expected.column_names) == GPU_COLUMNS
            assert by_capture[name] == expected.to_pylist(), name
            compared += 1
    assert compared == COPIES * (len(SAMPLES) - 1)
    gpus_per_copy = len(SAMPLES) - 1 + 1  # every sample but cpu_only_rank34 has GPU work, h100_2gpu on two GPUs
    assert sum(len(v) for v in by_capture.values()) == COPIES * gpus_per_copy
