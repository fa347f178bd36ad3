"""Every file a command writes (`ingest --db`, `query --out`, `sql --out`, `report -o`, `run --out`): what it may
replace, and one line, with nothing written or lost, when the file system refuses the write.

The file systems that refuse are real: a tmpfs of one page (full), one remounted read-only, a folder with
`chattr +i`, and a name the hidden file beside it would take past 255 bytes. Mounting needs root; those
cases skip with a reason where it is not.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from itertrace.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--workload", "worked-example", "--capacity", "8", "--out", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def db(run_dir) -> Path:
    db = run_dir.parent / "run.duckdb"
    assert main(["ingest", str(run_dir), "--db", str(db), "--quiet"]) == 0
    return db


def commands(run_dir: Path, db: Path) -> dict[str, Callable[[Path], list[str]]]:
    """Each command that writes a file, as the arguments that write `target`."""
    return {
        "ingest --db": lambda target: ["ingest", str(run_dir), "--db", str(target), "--quiet"],
        "query --out": lambda target: ["query", "membership_iterations", "--db", str(db), "--format", "csv",
                                       "--out", str(target)],
        "sql --out": lambda target: ["sql", "--db", str(db), "SELECT * FROM range(2000)", "--format", "json",
                                     "--out", str(target)],
        "report -o": lambda target: ["report", "--db", str(db), "-o", str(target), "--quiet"],
        "run --out": lambda target: ["run", "--workload", "worked-example", "--capacity", "8", "--out", str(target)],
    }


COMMANDS = ("ingest --db", "query --out", "sql --out", "report -o", "run --out")
FILE_COMMANDS = COMMANDS[:4]


def failure(capsys, argv: list[str]) -> str:
    """The one error line of a failing `itertrace` command (nothing on stdout, no traceback)."""
    status = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status != 0 and len(lines) == 1 and lines[0].startswith("itertrace: error: "), (status, captured.err)
    assert captured.out == ""
    return lines[0]


def listing(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    return {p.name: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in folder.iterdir()}


@pytest.mark.parametrize("command", FILE_COMMANDS)
@pytest.mark.parametrize("what", ["text", "JSON object", "FIFO", "character device", "other kind"])
def test_a_target_of_another_kind_is_refused(command, what, run_dir, db, tmp_path, capsys):
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "target.out"
    if what == "text":
        target.write_text("my notes, the only copy\nline two\n")
    elif what == "JSON object":  # a one-line trace or settings file: commas, but no CSV a command wrote
        target.write_text('{"schemaVersion": 1, "traceEvents": [], "displayTimeUnit": "ns"}\n')
    elif what == "FIFO":
        os.mkfifo(target)
    elif what == "character device":
        try:
            os.mknod(target, 0o666 | 0o020000, os.makedev(1, 3))  # as /dev/null
        except PermissionError:
            pytest.skip("cannot make a device node here (needs root)")
    elif command == "ingest --db":  # query output is no database
        pq.write_table(pa.table({"x": [1, 2]}), target)
    else:  # a database is no query output and no report
        with duckdb.connect(str(target)) as con:
            con.execute("CREATE TABLE t AS SELECT 1 AS x")
    before = listing(folder)
    line = failure(capsys, commands(run_dir, db)[command](target))
    assert str(target) in line, line
    assert ("is a FIFO" if what == "FIFO" else "is a character device" if what == "character device"
            else "holds something other than") in line, line
    assert listing(folder) == before


@pytest.mark.parametrize("command, fmt", [("query --out", "csv"), ("query --out", "table"), ("sql --out", "json"),
                                          ("sql --out", "parquet"), ("report -o", None)])
def test_a_file_the_command_wrote_is_replaced(command, fmt, run_dir, db, tmp_path, capsys):
    target = tmp_path / "again.out"
    argv = commands(run_dir, db)[command](target)
    if fmt is not None:
        argv[argv.index("--format") + 1] = fmt
    assert main(argv) == 0
    first = target.read_bytes()
    target.write_bytes(first)  # the same bytes, written anew: replaced again without a word
    assert main(argv) == 0
    assert target.stat().st_size > 0 and sorted(p.name for p in tmp_path.iterdir()) == ["again.out"]
    capsys.readouterr()


@contextlib.contextmanager
def refusing_folder(tmp_path: Path, how: str) -> Iterator[Path]:
    """A folder whose file system refuses writes `how`: full, read-only, immutable; or a plain one."""
    folder = tmp_path / how
    folder.mkdir()
    undo: list[list[str]] = []
    try:
        if how in ("full", "read-only"):
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(folder)], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root")
            undo.append(["umount", str(folder)])
            (folder / "kept.txt").write_text("here before")
            if how == "read-only":
                subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        elif how == "immutable":
            (folder / "kept.txt").write_text("here before")
            done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot chattr +i here ({done.stderr.strip() or 'chattr failed'}): needs root")
            undo.append(["chattr", "-i", str(folder)])
        yield folder
    finally:
        for command in reversed(undo):
            subprocess.run(command, check=True)  # a mount still busy would fail the test here


REASONS = {"full": "No space left on device", "read-only": "Read-only file system",
           "immutable": "Operation not permitted", "long name": "file name too long"}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("how", ["full", "read-only", "immutable", "long name"])
def test_a_refused_write_is_one_line_and_leaves_nothing(command, how, run_dir, db, tmp_path, capsys):
    with refusing_folder(tmp_path, how) as folder:
        name = "n" * 240 + ".out" if how == "long name" else "target.out"
        target = folder / name
        before = listing(folder)
        line = failure(capsys, commands(run_dir, db)[command](target))
        assert REASONS[how].lower() in line.lower() and str(folder) in line, line
        assert listing(folder) == before
