"""The engine (itertrace.profiler) stands below ingest, the queries, the dashboards, the experiments and the fleet:
it imports none of them."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ABOVE = ("itertrace.ingest", "itertrace.queries", "itertrace.dashboards", "itertrace.experiments", "itertrace.fleet")

# In a fresh interpreter: import itertrace.profiler, then each of its modules in turn, and after each
# name the modules of ABOVE that sys.modules holds (it only grows, so the first module listed brought them).
PROBE = f"""
import importlib, json, pkgutil, sys
above = {ABOVE!r}
def loaded():
    return sorted(m for m in sys.modules if m.startswith(above))
import itertrace.profiler
found = {{"itertrace.profiler": loaded()}}
for info in sorted(pkgutil.walk_packages(itertrace.profiler.__path__, "itertrace.profiler."), key=lambda i: i.name):
    name = info.name
    importlib.import_module(name)
    found[name] = loaded()
print(json.dumps(found))
"""


def test_no_profiler_module_imports_ingest_queries_or_dashboards():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert {name: mods for name, mods in found.items() if mods} == {}
    # the probe saw the modules: the package, its command line, its engine loop and its runners
    assert {"itertrace.profiler", "itertrace.profiler.cli", "itertrace.profiler.engine",
            "itertrace.profiler.runners.torch.torch_runner", "itertrace.profiler.runners.sim_runner",
            "itertrace.profiler.scheduling.scheduler", "itertrace.profiler.tracing.nvtx_ranges"} <= set(found)


def test_the_probe_sees_an_import_from_above():
    """The probe names what a module brings from above (here an import of the nsys loader put beside the package's)."""
    probe = PROBE.replace("import itertrace.profiler\n", "import itertrace.profiler\nimport itertrace.ingest.nsys\n", 1)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "itertrace.ingest.nsys" in json.loads(done.stdout)["itertrace.profiler"]


def test_no_profiler_source_imports_from_above_even_inside_a_function():
    """Imports inside functions escape the probe until they run: none in the source either."""
    profiler = Path(__file__).resolve().parents[2] / "profiler"
    found = []
    for path in sorted(profiler.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(profiler)}:{node.lineno} {n}" for n in names if n.startswith(ABOVE)]
    assert len(list(profiler.rglob("*.py"))) > 30 and found == []
