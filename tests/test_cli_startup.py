"""`itertrace` start-up: building the parser imports no heavy library, and the values written out for that agree."""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

from itertrace.ingest import IngestOptions
from itertrace.cli import PARTS
from itertrace.ingest.cli import BATCH_ROWS, STORE_AUTO_ROWS, STORE_CHOICES
from itertrace.profiler.cli import MODES, POLICIES, PREEMPTIONS
from itertrace.profiler.scheduling.policies import Policy
from itertrace.profiler.scheduling.request import PreemptKind
from itertrace.profiler.scheduling.scheduler import Mode
from itertrace.queries import output
from itertrace.queries import stored
from itertrace.queries.cli import FORMATS

HEAVY = ("numpy", "pyarrow", "duckdb", "torch", "altair", "pandas")


def test_building_the_parser_imports_no_heavy_library():
    # In a fresh interpreter: this one has imported them all already.
    code = ("import sys; from itertrace.cli import build_parser; build_parser(); "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_choices_written_out_for_the_parser_match_their_sources():
    assert MODES == tuple(m.value for m in Mode)
    assert POLICIES == tuple(p.value for p in Policy)
    assert PREEMPTIONS == tuple(k.value for k in PreemptKind)
    assert BATCH_ROWS == IngestOptions.batch_rows
    assert FORMATS == output.FORMATS
    assert (STORE_CHOICES, STORE_AUTO_ROWS) == (stored.STORE_CHOICES, stored.STORE_AUTO_ROWS)


def test_each_part_adds_the_commands_written_out_for_it():
    for module_name, commands in PARTS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module_name).register(sub)
        assert tuple(sub.choices) == commands


def test_a_command_imports_its_own_part_only():
    code = ("import sys; from itertrace.cli import PARTS, build_parser; build_parser('sql'); "
            "print(','.join(m for m in PARTS if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "itertrace.queries.cli"
