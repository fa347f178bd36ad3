"""`itertrace report` with no parameters on every real capture: GPU captures get the GPU sections, CPU ones today's.

The charts of each report are counted: three GPU charts (time, idle causes, operations) on every
capture with GPU work, plus the host-gap and timeline charts where auto found an iteration range.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from itertrace.cli import main
from itertrace.dashboards.report import build_report
from itertrace.ingest import ingest

SAMPLES = Path(__file__).parents[2] / ".." / "shared" / "nsys_samples"
GPU_SECTIONS = ["gpu-time", "gpu-idle", "gpu-kernels", "nvtx-ranges"]
# capture -> (charts, whether auto finds an iteration range): three GPU charts, and two more with a mapping
EXPECTED = {
    "h100_2gpu_1s_pqtdir": (3, False),  # a training window: no range repeats like an iteration
    "mfu_2gpu_before_pqtdir": (5, True),
    "mfu_2gpu_after_pqtdir": (5, True),
    "cloverleaf_4gpu_pqtdir": (3, False),  # no NVTX at all
    "arrow_2022.4/cudf.arrow": (5, True),
    "arrow_2022.4/cupy.arrow": (3, False),
    "arrow_2022.4/workflow.arrow": (3, False),
    "arrow_2022.4/cpython-nvtx-patch.arrow": (0, False),  # CPU only
    "arrow_2022.4/multiprocessing.arrow": (0, False),
}

shared = pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"real nsys exports not found at {SAMPLES.resolve()}")


@pytest.fixture(scope="module")
def capture_dbs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("reports")
    return {name: ingest([SAMPLES / name], folder / f"{Path(name).stem}.duckdb").db for name in EXPECTED}


@shared
@pytest.mark.shared
@pytest.mark.parametrize("name", list(EXPECTED))
def test_report_without_parameters_answers_on_every_capture(capture_dbs, name):
    charts, mapped = EXPECTED[name]
    report = build_report([capture_dbs[name]])
    ids = [s.id for s in report.sections]
    assert len(report.charts()) == charts
    if charts:  # GPU work: its sections first, each with something in it
        assert ids[:4] == GPU_SECTIONS and all(s.blocks for s in report.sections[:4])
        names = [c.name for c in report.charts()]
        assert names[:3] == ["gpu-time", "gpu-idle-causes", "gpu-kernels"]
        assert ("host-gaps" in names and "timeline" in names) == mapped
        assert report.tables()[0].title == "GPU time per GPU" and report.tables()[0].table.num_rows >= 1
    else:  # no GPU work and no iteration range: which ranges repeat, instead of nothing
        assert not set(GPU_SECTIONS[:3]) & set(ids) and ids[:2] == ["nvtx-ranges", "host-gaps"]
        assert [type(b).__name__ for b in report.sections[0].blocks] in (["TableBlock"], ["NoteBlock"])
    assert len(report.mappings) == 1
    assert report.mappings[0].startswith("No steps: ") != mapped
    if mapped:  # the range auto took: the best suggestion, since no engine preset's range is in these captures
        assert report.mappings[0].startswith("Steps of the best suggested range: ")
        assert "mapping chosen automatically; the same explicitly: `--param preset=generic --param step_pattern=" \
            in report.mappings[0]


def test_cpu_samples_keep_todays_sections_and_name_the_steps_auto_chose(sample_dbs, tmp_path):
    out = tmp_path / "report.html"
    assert main(["report", "--db", str(sample_dbs["static"]), "-o", str(out), "--quiet"]) == 0
    page = out.read_text()
    assert re.findall(r'<section id="([^"]+)">', page) == [
        "runs", "host-gaps", "timeline", "membership", "slot-time", "active-tokens", "latency", "fairness",
        "log-vs-trace"]
    assert re.findall(r'<div class="chart" id="chart-\d+" data-spec="spec-\d+" data-name="([^"]+)"', page) == [
        "host-gaps", "timeline", "membership", "slot-time", "active-tokens", "latency-cdf", "fairness-progress"]
    assert ("<p class=\"mapping\">itertrace&#x27;s reference engine (NVTX ranges): 544 steps, numbered 0 to 543, each "
            "a range named <code>step</code>; mapping chosen automatically; the same explicitly: "
            "<code>--param preset=itertrace</code>.</p>") in page


@shared
@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_a_gpu_report_renders_every_chart_in_chromium(capture_dbs, tmp_path):
    from test_report import _Charts, offline_chromium

    out = tmp_path / "gpu.html"
    assert main(["report", "--db", str(capture_dbs["mfu_2gpu_after_pqtdir"]), "-o", str(out), "--quiet"]) == 0
    result = subprocess.run(
        offline_chromium("--virtual-time-budget=30000", "--dump-dom", out.as_uri(), profile=tmp_path / "profile"),
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    parser = _Charts()
    parser.feed(result.stdout)
    assert len(parser.drawn) == 5 and all(parser.drawn.values()), parser.drawn
    assert parser.rendered == {chart: "yes" for chart in parser.drawn}
