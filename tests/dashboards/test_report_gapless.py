"""A trace whose iteration ranges have no device interval (a CPU-only profile, no range named as the device)
has no host gaps: the report says why in a note instead of drawing empty tables and charts."""
from __future__ import annotations

from pathlib import Path

import pytest

from itertrace.dashboards.report import build_report
from itertrace.ingest import ingest

CPU_ONLY = Path(__file__).parents[2] / ".." / "shared" / "kineto_samples" / "cpu_only_rank34.json.gz"


@pytest.mark.shared
@pytest.mark.skipif(not CPU_ONLY.is_file(), reason=f"Kineto sample not found at {CPU_ONLY.resolve()}")
def test_iterations_without_a_device_interval_get_a_note_not_empty_gap_charts(tmp_path):
    db = ingest([CPU_ONLY], tmp_path / "cpu.duckdb").db
    report = build_report([db])
    assert report.mappings[0].startswith("Steps of the best suggested range: 10 steps on 2 threads, numbered 0 to 4, "
                                         "each a range named `gloo:all_reduce`")  # it has iterations: it repeats
    gaps = next(s for s in report.sections if s.id == "host-gaps")
    assert [type(b).__name__ for b in gaps.blocks] == ["NoteBlock"]
    assert "no device interval" in gaps.blocks[0].text and "device_pattern" in gaps.blocks[0].text
    assert "host-gaps" not in [c.name for c in report.charts()]
    assert "timeline" in [c.name for c in report.charts()]  # the host steps are still drawn
