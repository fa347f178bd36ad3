"""`itertrace ingest` of a Kineto trace stays off the heavy libraries: it starts in a fraction of a second.

torch, pandas and altair each take longer to import than the whole ingest of a small trace; pyarrow, which
only the nsys and run-directory loaders read with, is imported where they read
(benchmarks/bench_kineto.py measures the imports and the ingest side by side).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "pandas", "altair", "pyarrow")
PROBE = """
import sys
from itertrace.cli import main
status = main(["ingest", "--quiet", "--db", sys.argv[1], sys.argv[2]])
print(status, " ".join(sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[3:]))))
"""


def test_ingest_process_imports_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10.5, "dur": 2, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 11, "dur": 1,
         "args": {"correlation": 3, "device": 0, "stream": 7}}]}))
    db = tmp_path / "t.duckdb"
    done = subprocess.run([sys.executable, "-c", PROBE, str(db), str(trace), *HEAVY], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split("\n")[0].strip() == "0", done.stdout + done.stderr
    assert db.is_file()
