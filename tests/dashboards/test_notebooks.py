"""The notebooks in dashboards/notebooks run clean, top to bottom, against sample_traces/."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "dashboards" / "notebooks"
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def test_the_three_notebooks_are_committed_without_outputs():
    assert NAMES == ["host_gap_investigation.ipynb", "quickstart.ipynb", "slot_time_study.ipynb"]
    for name in NAMES:
        cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code), name


@pytest.mark.nsys
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys (Nsight Systems) is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_clean(name, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("ITERTRACE_NOTEBOOK_OUT", str(tmp_path))
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(book, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    shown = [o for c in book.cells if c.cell_type == "code" for o in c.outputs
             if "application/vnd.vegalite.v5+json" in o.get("data", {}) or "text/html" in o.get("data", {})]
    assert shown, f"{name} displayed no chart or table"
