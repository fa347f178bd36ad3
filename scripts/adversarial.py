"""Bad inputs, faults and races against the commands that write or read user files, each run as a real
`itertrace` process; prints, per category, how many ended cleanly and how many ended in a traceback, lost
data or left files behind.

    .venv/bin/python scripts/adversarial.py [--keep DIR] [--only WORDS]

Clean means: exit 0 where the input is good, else one `itertrace:` line on stderr and a non-zero exit
(130/143 for a signal). Lost data: a file that was there before a failed command is no longer byte for
byte the same, or a refused target was written. Leftovers: any hidden file or folder beside the target
once the command (and, after a kill, the next command to the same target) has ended. Accepted: a corrupt
input the command took without a word (where a case expects a note, exit 0 without it). Files read: a
database whose views read a secret file, and the secret showed in the command's output or in a file it
wrote, or the command hung (a view reading a FIFO). Cases that need root (mount, mknod, chattr) are
skipped without it.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

CLI = [sys.executable, "-m", "itertrace.cli"]


@dataclass
class Case:
    """One command against one prepared folder, and what it must leave there."""

    category: str
    argv: list[str]
    folder: Path  # where the command writes: checked for leftovers and lost files
    good: bool = False  # the input is fine: only exit 0 is clean
    either: bool = False  # failing cleanly is clean too (a bit flip nothing can detect; a disk that may be full)
    tables: int | None = None  # on success, the tables the database at `argv`'s --db must hold
    kill: tuple[int, float] | None = None  # (signal, seconds after the command's hidden file appears)
    then: list[str] | None = None  # after a kill: the next command to the same target, which must clean up
    keep: dict[str, bytes] = field(default_factory=dict)  # files in `folder` before, by name
    hold: Path | None = None  # a database another process holds open read-write meanwhile
    never: tuple[Path, ...] = ()  # files the command must not make
    secret: str | None = None  # what a file the command must not read holds: in no output, in no file it writes
    says: str | None = None  # on exit 0, what stderr must hold (a note counting what was left out)
    unsaid: str | None = None  # on exit 0, what stderr must not hold
    rows: tuple[str, list[tuple]] | None = None  # on success, a query of the database at --db and its rows


@dataclass
class Tally:
    cases: int = 0
    clean: int = 0
    tracebacks: int = 0
    lost: int = 0
    leftovers: int = 0
    accepted: int = 0
    read: int = 0
    exits: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


HOLDER = ("import sys, duckdb; con = duckdb.connect(sys.argv[1]); con.execute('CREATE TABLE IF NOT EXISTS mine AS "
          "SELECT 7 AS x'); con.execute('CHECKPOINT'); print('ready', flush=True); sys.stdin.readline()")


def run(case: Case) -> tuple[int, str, list[str], bool]:
    """Run the case: its exit status, its stderr, the kept files it changed (before any `then`), and whether it
    read the secret file (or hung trying)."""
    holder = None
    if case.hold is not None:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(case.hold)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        holder.stdout.readline()
        case.keep = {case.hold.name: case.hold.read_bytes()}
    proc = subprocess.Popen([*CLI, *case.argv], stdout=subprocess.PIPE if case.secret else subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    if case.kill:
        signum, after_s = case.kill
        deadline = time.monotonic() + 120
        while proc.poll() is None and not any(p.name.startswith(".") for p in case.folder.iterdir()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        time.sleep(after_s)
        if proc.poll() is None:
            proc.send_signal(signum)
    hung = False
    try:
        out, err = proc.communicate(timeout=120 if case.secret else 600)
    except subprocess.TimeoutExpired:  # a view reading a FIFO would wait here for a writer that never comes
        proc.kill()
        out, err = proc.communicate()
        hung = True
    finally:
        proc.kill()
        if holder is not None:
            holder.kill()
            holder.wait()
    lost = [name for name, data in case.keep.items()
            if proc.returncode != 0 and (not (case.folder / name).is_file() or (case.folder / name).read_bytes() != data)]
    lost += [str(path) for path in case.never if path.exists()]
    if case.tables is not None and proc.returncode == 0:
        db = Path(case.argv[case.argv.index("--db") + 1])
        with duckdb.connect(str(db), read_only=True) as con:
            if con.execute("SELECT count(*) FROM duckdb_tables()").fetchone()[0] != case.tables:
                lost.append(f"{db.name} (incomplete)")
    if case.rows is not None and proc.returncode == 0:
        db = Path(case.argv[case.argv.index("--db") + 1])
        with duckdb.connect(str(db), read_only=True) as con:
            if con.execute(case.rows[0]).fetchall() != case.rows[1]:
                lost.append(f"{db.name} (rows)")
    read = bool(case.secret) and (hung or case.secret in (out or "") + err or any(
        case.secret.encode() in p.read_bytes() for p in case.folder.rglob("*") if p.is_file()))
    if case.then:
        subprocess.run([*CLI, *case.then], capture_output=True)
    return proc.returncode, err, lost, read


def judge(case: Case, status: int, err: str, lost: list[str], read: bool, tally: Tally) -> None:
    tally.cases += 1
    tally.exits[status] += 1
    lines = err.strip().splitlines()
    if case.kill:  # the signal's own status, or 0 where the command ended first
        expected = {0, {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 143, signal.SIGINT: 130}[case.kill[0]]}
    else:
        expected = None
    traceback = "Traceback (most recent call last)" in err or (
        status not in (0, -signal.SIGKILL) and not (lines and lines[-1].startswith("itertrace:")))
    if expected is not None and status not in expected:
        traceback = True
    left = [p.name for p in case.folder.iterdir() if p.name.startswith(".")]
    silent = status == 0 and ((case.says is not None and case.says not in err)
                              or (case.unsaid is not None and case.unsaid in err))
    accepted = (status == 0 and not case.good and case.kill is None) or silent
    failed = case.good and not case.either and case.kill is None and status != 0
    tally.tracebacks += traceback
    tally.read += read
    tally.lost += bool(lost)
    tally.leftovers += bool(left)
    tally.accepted += accepted
    if traceback or lost or left or read or failed or (accepted and not case.either):
        what = ("traceback" if traceback else "lost " + ",".join(lost) if lost else "left " + ",".join(left)
                if left else "read the secret" if read else "failed" if failed else "accepted")
        tally.notes.append(f"{' '.join(case.argv)[:110]}: {what} (exit {status}; {lines[-1][:120] if lines else ''})")
    else:
        tally.clean += 1


def arrow_export(path: Path, rows: int, seed: int = 1) -> Path:
    """An nsys-shaped Arrow export: StringIds, ThreadNames, NVTX_EVENTS of push/pop ranges, metadata, PROCESSES."""
    rng = random.Random(seed)
    starts = sorted(rng.randrange(10**12) for _ in range(rows))
    tid = (4242 << 24) | 4243
    tables = {
        "StringIds": pa.table({"id": pa.array(range(100), pa.uint32()),
                               "value": pa.array([f"name{i}".encode() for i in range(100)], pa.binary())}),
        "ThreadNames": pa.table({"nameId": pa.array([1], pa.uint32()), "priority": pa.array([0], pa.int32()),
                                 "globalTid": pa.array([tid], pa.uint64())}),
        "NVTX_EVENTS": pa.table({"start": pa.array(starts, pa.int64()),
                                 "end": pa.array([s + rng.randrange(1, 10**6) for s in starts], pa.int64()),
                                 "eventType": pa.array([59] * rows, pa.uint32()),
                                 "textId": pa.array([rng.randrange(100) for _ in range(rows)], pa.uint32()),
                                 "globalTid": pa.array([tid] * rows, pa.uint64())}),
        "EXPORT_META_DATA": pa.table({"name": pa.array([b"EXPORT_PRODUCT_VERSION"]), "value": pa.array([b"2022.4.2"])}),
        "PROCESSES": pa.table({"globalPid": pa.array([4242 << 24], pa.uint64()), "pid": pa.array([4242], pa.uint64()),
                               "name": pa.array([b"python"])}),
    }
    with open(path, "wb") as sink:
        for name, table in tables.items():
            with ipc.new_stream(sink, table.schema.with_metadata({"table_name": name})) as writer:
                writer.write_table(table)
    return path


class Workspace:
    """Fresh folders under one root, some on a small tmpfs (root only)."""

    def __init__(self, root: Path) -> None:
        self.root, self.n, self.mounts = root, 0, []

    def folder(self, fs: str | None = None, keep: dict[str, bytes] | None = None) -> Path | None:
        self.n += 1
        folder = self.root / f"case{self.n}"
        folder.mkdir()
        if fs and fs.split(":")[0] in ("full", "read-only") and not self._mount(folder, (fs + ":4k").split(":")[1]):
            return None
        for name, data in (keep or {}).items():
            (folder / name).write_bytes(data)
        if fs == "read-only" and subprocess.run(["mount", "-o", "remount,ro", str(folder)]).returncode:
            return None
        if fs == "immutable" and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            return None
        return folder

    def _mount(self, folder: Path, size: str) -> bool:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode:
            return False
        self.mounts.append(folder)
        return True

    def close(self) -> None:
        for folder in self.root.iterdir():
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        for folder in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def cases(ws: Workspace, src: Path) -> list[Case]:
    """Every case, built on the prepared sources in `src`."""
    run_dir, db, small, big = src / "run", src / "run.duckdb", src / "small.arrow", src / "big.arrow"
    old_db = (src / "old.duckdb").read_bytes()
    out: list[Case] = []

    def add(category: str, argv: Callable[[Path], list[str]], fs: str | None = None, name: str = "target.out",
            keep: dict[str, bytes] | None = None, **kw) -> None:
        folder = ws.folder(fs, keep)
        if folder is not None:
            out.append(Case(category, argv(folder / name), folder, keep=dict(keep or {}), **kw))

    writers = {
        "ingest --db": lambda t: ["ingest", str(run_dir), "--db", str(t), "--quiet"],
        "query --out": lambda t: ["query", "membership_iterations", "--db", str(db), "--format", "csv", "--out", str(t)],
        "sql --out": lambda t: ["sql", "--db", str(db), "SELECT * FROM range(5000)", "--format", "json", "--out", str(t)],
        "report -o": lambda t: ["report", "--db", str(db), "-o", str(t), "--quiet"],
        "run --out": lambda t: ["run", "--workload", "worked-example", "--out", str(t)],
    }
    for what, argv in writers.items():
        for fs in ("full", "read-only", "immutable"):
            add(f"1/8 {fs} file system", argv, fs, keep={"kept.txt": b"here before"})
        add("8 names past NAME_MAX", argv, name="n" * 240 + ".out")
        others = {"text": b"my notes, the only copy\nline two\n", "parquet": src.joinpath("p.parquet").read_bytes(),
                  "database": old_db}
        kinds = {"ingest --db": ("text", "parquet"), "query --out": ("text", "database"),
                 "sql --out": ("text", "database"), "report -o": ("text", "parquet", "database")}
        for kind in kinds.get(what, ()):
            add("2 targets of another kind", argv, name="target.out", keep={"target.out": others[kind]})
    for size in ("1m", "4m", "8m", "12m", "16m", "24m"):  # from no room for DuckDB's log to room for all
        add("1 full disk over an old database", lambda t: ["ingest", str(big), "--db", str(t), "--quiet"],
            f"full:{size}", name="keep.duckdb", keep={"keep.duckdb": old_db}, good=True, either=True,
            tables=int((src / "big.tables").read_text()))
    for _ in range(2):
        held = ws.folder()
        out.append(Case("3 database held read-write", ["ingest", str(small), "--db", str(held / "held.duckdb")],
                        held, hold=held / "held.duckdb"))
    for delay in (0.0, 0.5, 2.0):
        add("4 killed ingest, then another", lambda t: ["ingest", str(big), "--db", str(t), "--batch-rows", "1",
                                                        "--quiet"], name="k.duckdb", keep={"k.duckdb": old_db},
            kill=(signal.SIGKILL, delay), then=["ingest", str(small), "--db", "{target}", "--quiet"], good=True)
    data = small.read_bytes()
    ends = _stream_ends(small)
    for i, end in enumerate([*ends[:-1], len(data) // 2, len(data) - 3]):
        (src / f"cut{i}.arrow").write_bytes(data[:end])
        add("5 cut Arrow exports", lambda t, i=i: ["ingest", str(src / f"cut{i}.arrow"), "--db", str(t)],
            name="t.duckdb", keep={"t.duckdb": old_db})
    for i, flip in enumerate(random.Random(7).sample(range(64, len(data) - 64), 10)):
        flipped = bytearray(data)
        flipped[flip] ^= 0x10
        (src / f"flip{i}.arrow").write_bytes(bytes(flipped))
        add("7 bit flips (not detectable: counted, not failures)", lambda t, i=i: [
            "ingest", str(src / f"flip{i}.arrow"), "--db", str(t), "--quiet"], name="t.duckdb",
            keep={"t.duckdb": old_db}, either=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        for delay in (0.2, 1.0, 3.0):
            add("11 signals while a source streams", lambda t: ["ingest", str(big), "--db", str(t), "--batch-rows",
                                                                 "1", "--quiet"], name="s.duckdb",
                keep={"s.duckdb": old_db}, kill=(sig, delay))
    bad_args = [
        ["ingest", str(run_dir), "--db", "{target}", "--memory-limit", "1KB"],
        ["ingest", str(run_dir), "--db", "{target}", "--memory-limit", "20MB"],
        ["run", "--workload", "synthetic", "--prompt-len", str(10**30), "--out", "{target}"],
        ["run", "--workload", "synthetic", "--output-len", str(2**63), "--out", "{target}"],
        ["run", "--num-blocks", "1000000000000", "--workload", "worked-example", "--out", "{target}"],
        ["run", "--runner", "torch", "--num-blocks", "1000000000000", "--workload", "worked-example", "--out",
         "{target}"],
        ["run", "--workload", str(src / "deep.jsonl"), "--out", "{target}"],
        ["run", "--workload", str(src / "huge.jsonl"), "--out", "{target}"],
        ["sql", "--db", str(db), b"SELECT '\xff'".decode("utf-8", "surrogateescape")],
        ["sql", "--db", str(db), f"COPY (SELECT 1) TO '{src}/copied.csv'"],
        ["sql", "--db", str(db), "SELECT * FROM read_csv('/etc/passwd')"],
        ["sql", "--db", str(db), "INSTALL httpfs"],
        ["sql", "--db", str(db), f"EXPORT DATABASE '{src}/exported'"],
        ["query", "membership", "--db", str(db), "--param", "preset=generic", "--param", "preset=itertrace"],
        ["ingest", str(src / "seed.run"), "--db", "{target}"],
        ["report", "--db", str(src / "varchar.duckdb"), "-o", "{target}"],
    ]
    never = (src / "copied.csv", src / "exported")
    for argv in bad_args:
        add("9-13 bad values", lambda t, argv=argv: [str(t) if a == "{target}" else a for a in argv], name="t.out",
            never=never)
    out += crafted_database_cases(ws, src)
    out += output_target_cases(ws, src, db)
    for case in out:
        if case.then:
            case.then = [str(case.folder / "k.duckdb") if a == "{target}" else a for a in case.then]
    return out


SECRET = "a-secret-only-its-owner-may-read"
# How a crafted database's view reads the file {path}: each a way DuckDB reads files.
READS = {
    "read_text": "(SELECT content FROM read_text('{path}'))",
    "read_csv": "(SELECT string_agg(column0, ',') FROM read_csv('{path}', header = false))",
    "read_blob": "(SELECT content::VARCHAR FROM read_blob('{path}'))",
    "glob": "(SELECT string_agg(file, ',') FROM glob('{folder}/*'))",
    "macro": "(SELECT content FROM _stolen())",
}


def crafted(src: Path, name: str, view: str, read: str, path: Path) -> Path:
    """A copy of `src`'s database `name` whose view (or table) `view` carries in its text column what `read`
    gets from `path`."""
    db = path.parent / f"crafted-{view}-{read}.duckdb"
    shutil.copy(src / name, db)
    how = READS[read].format(path=path, folder=path.parent)
    with duckdb.connect(str(db)) as con:
        kind = con.execute("SELECT CASE WHEN EXISTS (SELECT 1 FROM duckdb_views() WHERE view_name = ?) THEN 'VIEW' "
                           "ELSE 'TABLE' END", [view]).fetchone()[0]
        if read == "macro":
            con.execute(f"CREATE MACRO _stolen() AS TABLE SELECT content FROM read_text('{path}')")
        con.execute(f"ALTER {kind} {view} RENAME TO _honest_{view}")
        column = "text" if view == "nvtx_ranges" else "final_state"
        con.execute(f"CREATE VIEW {view} AS SELECT * REPLACE ({how} AS {column}) FROM _honest_{view}")
    return db


def crafted_database_cases(ws: Workspace, src: Path) -> list[Case]:
    """Every command that opens a database, on databases whose views read a secret file (or a FIFO)."""
    cases = []
    secrets = ws.root / "secrets"
    secrets.mkdir()
    (secrets / "secret.txt").write_text(SECRET + "\n")
    (secrets / SECRET).write_text("its name is the secret\n")  # what glob would list
    (secrets / "fifo").write_text(SECRET + "\n")  # a file while the views are made (DuckDB opens it to bind them)
    dbs = {(view, read, fifo): crafted(src, name, view, read, secrets / ("fifo" if fifo else "secret.txt"))
           for name, view in (("big.duckdb", "nvtx_ranges"), ("run.duckdb", "run_requests"))
           for read in READS for fifo in (False, True) if not (fifo and read in ("glob", "read_blob"))}
    (secrets / "fifo").unlink()
    os.mkfifo(secrets / "fifo")  # then a FIFO: read, it waits for a writer that never comes
    for (view, read, fifo), db in dbs.items():
        query = "gpu_time_summary" if view == "nvtx_ranges" else "membership"
        for argv in (["query", query, "--db", str(db), "--format", "csv", "--out", "{folder}/rows.csv"],
                     ["sql", "--db", str(db), "SELECT 1"],
                     ["sql", "--db", str(db), f"SELECT * FROM {view}"],
                     ["mapping", "suggest", "--db", str(db)],
                     ["report", "--db", str(db), "-o", "{folder}/report.html"],
                     ["export", "perfetto", "--db", str(db), "-o", "{folder}/timeline.json"]):
            if argv[0] == "mapping" and view != "nvtx_ranges":
                continue
            folder = ws.folder()
            cases.append(Case(f"14 crafted databases ({'FIFO' if fifo else read})",
                              [a.replace("{folder}", str(folder)) for a in argv], folder, secret=SECRET))
    return cases


def output_target_cases(ws: Workspace, src: Path, db: Path) -> list[Case]:
    """Each writer's target holding what another program wrote: refused, and left as it was."""
    kineto = json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0,
                                                              "tid": 7, "ts": 1.0, "dur": 2.0}]}).encode()
    theirs = {"settings.json": b'{"theme": "dark"}\n', "rank0.pt.trace.json.gz": gzip.compress(kineto),
              "rank0.pt.trace.json": kineto}
    writers = {
        "export perfetto -o": lambda t: ["export", "perfetto", "--db", str(db), "-o", str(t)],
        "calibrate --out": lambda t: ["calibrate", "--out", str(t)],
        "sql --out": lambda t: ["sql", "--db", str(db), "SELECT 1 AS x", "--format", "json", "--out", str(t)],
        "report -o": lambda t: ["report", "--db", str(db), "-o", str(t)],
    }
    cases = []
    for what, argv in writers.items():
        for name, data in theirs.items():
            folder = ws.folder(keep={name: data})
            cases.append(Case(f"15 output targets ({what})", argv(folder / name), folder, keep={name: data}))
        folder = ws.folder()
        os.mkfifo(folder / "fifo.json")
        cases.append(Case(f"15 output targets ({what})", argv(folder / "fifo.json"), folder))
    folder = ws.folder(keep={"03-active-tokens.png": b"my notes\n"})
    cases.append(Case("15 output targets (report --png)", ["report", "--db", str(db), "-o", str(folder / "r.html"),
                                                           "--png", str(folder)], folder,
                      keep={"03-active-tokens.png": b"my notes\n"}, never=(folder / "r.html",)))
    return cases


def _stream_ends(path: Path) -> list[int]:
    ends = []
    with pa.memory_map(str(path)) as source:
        while source.tell() < source.size():
            for _ in ipc.open_stream(source):
                pass
            ends.append(source.tell())
    return ends


# ---- 20 numeric extremes, 21 engine limits: inputs at the ends of their types, and workloads past the engine's --

EXTREMES, LIMITS = "20 numeric extremes", "21 engine limits"
_TID, _PID = (4242 << 24) | 4243, 4242 << 24
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _i64(*values: int | None) -> pa.Array:
    return pa.array(values, pa.int64())


def nsys_tables() -> dict[str, pa.Table]:
    """A small capture in nsys's shape: strings, a thread's ranges, a runtime call and the kernel it launched."""
    return {
        "StringIds": pa.table({"id": _i64(0, 1, 2, 3), "value": ["step", "cudaLaunchKernel", "gemm(float*)", "gemm"]}),
        "ThreadNames": pa.table({"nameId": _i64(0), "priority": _i64(0), "globalTid": _i64(_TID)}),
        "NVTX_EVENTS": pa.table({"start": _i64(10, 20), "end": _i64(100, 60), "eventType": _i64(59, 59),
                                 "textId": _i64(0, 0), "globalTid": _i64(_TID, _TID)}),
        "CUPTI_ACTIVITY_KIND_RUNTIME": pa.table({"start": _i64(21), "end": _i64(25), "eventClass": _i64(0),
                                                 "globalTid": _i64(_TID), "correlationId": _i64(11),
                                                 "nameId": _i64(1)}),
        "CUPTI_ACTIVITY_KIND_KERNEL": pa.table({"start": _i64(200), "end": _i64(300), "deviceId": _i64(0),
                                                "contextId": _i64(1), "streamId": _i64(7), "correlationId": _i64(11),
                                                "globalPid": _i64(_PID), "demangledName": _i64(2),
                                                "shortName": _i64(3)}),
        "ENUM_CUDA_MEMCPY_OPER": pa.table({"id": _i64(1), "name": ["HTOD"], "label": ["Host-to-Device"]}),
        "EXPORT_META_DATA": pa.table({"name": ["EXPORT_PRODUCT_VERSION"], "value": ["2022.4.2.1"]}),
        "PROCESSES": pa.table({"globalPid": _i64(_PID), "pid": _i64(4242), "name": ["python"]}),
    }


def _changed(table: pa.Table, **columns: pa.Array) -> pa.Table:
    for name, values in columns.items():
        at = table.schema.get_field_index(name)
        table = table.set_column(at, name, values) if at >= 0 else table.append_column(name, values)
    return table


def _parquetdir(folder: Path, tables: dict[str, pa.Table], suffix: str = ".parquet") -> Path:
    folder.mkdir()
    for name, table in tables.items():
        if suffix == ".parquet":
            pq.write_table(table, folder / f"{name}.parquet")
        else:
            with ipc.new_stream(folder / f"{name}.arrow", table.schema) as writer:
                writer.write_table(table)
    return folder


def _arrow(path: Path, tables: dict[str, pa.Table]) -> Path:
    with open(path, "wb") as sink:
        for name, table in tables.items():
            with ipc.new_stream(sink, table.schema.with_metadata({"table_name": name})) as writer:
                writer.write_table(table)
    return path


def _kineto(path: Path, events: list[dict], **top) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


def prepare_extremes(src: Path) -> dict[str, tuple[Path, ...]]:
    """The inputs of the numeric extremes, by name: the sources each case ingests."""
    src.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(src / "old.duckdb")) as con:
        con.execute("CREATE TABLE keep_me AS SELECT 42 AS answer")
    out: dict[str, tuple[Path, ...]] = {}
    tables = nsys_tables()
    kernel, nvtx = tables["CUPTI_ACTIVITY_KIND_KERNEL"], tables["NVTX_EVENTS"]
    runtime = tables["CUPTI_ACTIVITY_KIND_RUNTIME"]
    variants = {
        "kernel from int64 min to int64 max": ("arrow", {"CUPTI_ACTIVITY_KIND_KERNEL": _changed(
            kernel, start=_i64(_I64_MIN), end=_i64(_I64_MAX))}),
        "kernel ending at int64 max": ("parquet", {"CUPTI_ACTIVITY_KIND_KERNEL": _changed(kernel, end=_i64(_I64_MAX))}),
        "runtime call starting at 2^62": ("parquet", {"CUPTI_ACTIVITY_KIND_RUNTIME": _changed(
            runtime, start=_i64(2**62), end=_i64(2**62 + 1))}),
        "range starting at int64 min": ("parquet", {"NVTX_EVENTS": _changed(nvtx, start=_i64(_I64_MIN, 20))}),
        "kernel ending before it starts": ("parquet", {"CUPTI_ACTIVITY_KIND_KERNEL": _changed(kernel, end=_i64(150))}),
        "range ending before it starts": ("arrow", {"NVTX_EVENTS": _changed(nvtx, end=_i64(100, 19))}),
        "column named ''": ("parquet", {"StringIds": _changed(tables["StringIds"], **{"": pa.array(["x"] * 4)})}),
        "columns value and VALUE": ("arrow", {"StringIds": _changed(tables["StringIds"], VALUE=pa.array(["x"] * 4))}),
        "NVTX_EVENTS of 0 rows": ("parquet", {"NVTX_EVENTS": nvtx.slice(0, 0)}),
        "kernels of 0 rows": ("arrow", {"CUPTI_ACTIVITY_KIND_KERNEL": kernel.slice(0, 0)}),
        "StringIds of 0 rows, referred to": ("parquet", {"StringIds": tables["StringIds"].slice(0, 0)}),
        "StringIds rows twice": ("parquet", {"StringIds": pa.concat_tables([tables["StringIds"]] * 2)}),
        "an ENUM id twice": ("arrow", {"ENUM_CUDA_MEMCPY_OPER": pa.concat_tables([tables["ENUM_CUDA_MEMCPY_OPER"]]
                                                                                * 2)}),
    }
    for i, (name, (layout, changes)) in enumerate(variants.items()):
        changed = {**tables, **changes}
        out[name] = ((_arrow(src / f"v{i}.arrow", changed),) if layout == "arrow"
                     else (_parquetdir(src / f"v{i}", changed),))
    makers = {"a FIFO": os.mkfifo, "a folder": os.mkdir,
              "a dangling symbolic link": lambda p: p.symlink_to(src / "gone" / p.name),
              "a looping symbolic link": lambda p: p.symlink_to(p.name)}
    for i, (what, make) in enumerate(makers.items()):
        for table in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds", "PROCESSES"):
            for suffix in (".parquet", ".arrow"):
                folder = _parquetdir(src / f"k{i}{table}{suffix[1:]}", tables, suffix)
                (folder / f"{table}{suffix}").unlink()
                make(folder / f"{table}{suffix}")
                out[f"{table}{suffix} as {what}"] = (folder,)
    subprocess.run([*CLI, "run", "--workload", "worked-example", "--out", str(src / "run")], check=True,
                   capture_output=True)
    for name in ("run.json", "events.parquet"):
        shutil.copytree(src / "run", src / f"run-{name}")
        (src / f"run-{name}" / name).unlink()
        os.mkfifo(src / f"run-{name}" / name)
        out[f"run directory whose {name} is a FIFO"] = (src / f"run-{name}",)
    event = {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 7, "tid": 8, "ts": 10, "dur": 5}
    kernel_event = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12, "dur": 2,
                    "args": {"device": 0, "stream": 7, "correlation": 1}}
    rank0 = _kineto(src / "rank0.json", [event], baseTimeNanoseconds=1_700_000_000_000_000_000)
    for name, base in (("base time 2^80", 2**80), ("base time -2^63", -(2**63)), ("base time as text", "17e17")):
        out[name] = (rank0, _kineto(src / f"rank1-{len(out)}.json", [event], baseTimeNanoseconds=base))
    traces = {
        "ts of 9.3e15 us": [event, {**event, "ts": 9.3e15}],
        "ts + dur past 2^62 ns": [event, {**event, "ts": 4e15, "dur": 1e15}],
        "pid 2^70": [event, {**event, "pid": 2**70, "ts": 20}],
        "pid 7.5": [event, {**event, "pid": 7.5, "ts": 20}],
        "tid 'eight'": [event, {**event, "tid": "eight", "ts": 20}],
        "pid '7'": [{**event, "pid": "7"}],
        "pid 7.0": [{**event, "pid": 7.0}],
        "kernels without ts or dur": [event, kernel_event, {k: v for k, v in kernel_event.items() if k != "ts"},
                                      {k: v for k, v in kernel_event.items() if k != "dur"}],
        "negative dur": [event, kernel_event, {**kernel_event, "dur": -2}, {**event, "dur": -1}],
        "a plain trace": [event],
    }
    for i, (name, events) in enumerate(traces.items()):
        out[name] = (_kineto(src / f"t{i}.json", events),)
    body = json.dumps({"schemaVersion": 1, "traceEvents": [event, kernel_event]}).encode()
    for name, size, where in (("padded with 10 MB of white space", 10 << 20, "after"),
                              ("padded with 1 GB of white space", 1 << 30, "after"),
                              ("padded with 100 MB of white space before", 100 << 20, "before"),
                              ("padded with 100 MB of white space inside the array", 100 << 20, "inside")):
        path = src / f"pad{len(out)}.json.gz"
        with gzip.open(path, "wb", compresslevel=1) as sink:
            if where == "before":
                _write_blank(sink, size)
            sink.write(body[:-2] if where == "inside" else body)
            if where == "inside":
                _write_blank(sink, size)
                sink.write(b"]}")
            if where == "after":
                _write_blank(sink, size)
        out[name] = (path,)
    return out


def _write_blank(sink, size: int) -> None:
    block = b" \n" * (4 << 20)
    for _ in range(size // len(block)):
        sink.write(block)


def extreme_cases(ws: Workspace, src: Path) -> list[Case]:
    """Every numeric extreme, each ingested by a real `itertrace ingest` into a folder holding an old database."""
    inputs = prepare_extremes(src)
    old_db = (src / "old.duckdb").read_bytes()
    noted = {"pid 2^70": "1 event whose pid or tid is not an integer left out",
             "pid 7.5": "1 event whose pid or tid is not an integer left out",
             "tid 'eight'": "1 event whose pid or tid is not an integer left out",
             "kernels without ts or dur": "2 events without ts or dur left out (2 kernel)",
             "negative dur": "2 events with a negative dur left out (1 kernel, 1 user_annotation)"}
    threads = ("SELECT pid, tid FROM threads", [(7, 8)])
    good = {"pid '7'": threads, "pid 7.0": threads,
            "a plain trace": ("SELECT count(*) FROM nvtx_ranges", [(1,)]),
            "NVTX_EVENTS of 0 rows": ("SELECT count(*) FROM gpu_ops", [(1,)]),
            "kernels of 0 rows": ("SELECT count(*) FROM nvtx_ranges", [(2,)]),
            **{name: ("SELECT count(*) FROM gpu_ops", [(1,)]) for name in inputs if name.startswith("padded")}}
    kept = {"pid 2^70": ("SELECT count(*) FROM nvtx_ranges", [(1,)]),
            "kernels without ts or dur": ("SELECT start_ns, end_ns FROM gpu_ops", [(12_000, 14_000)]),
            "negative dur": ("SELECT count(*) FROM gpu_ops UNION ALL SELECT count(*) FROM nvtx_ranges", [(1,), (1,)])}
    out = []
    for name, sources in inputs.items():
        folder = ws.folder(keep={"t.duckdb": old_db})
        argv = ["ingest", *map(str, sources), "--db", str(folder / "t.duckdb"), "--quiet"]
        if name in noted:
            out.append(Case(EXTREMES, argv, folder, good=True, says=noted[name], rows=kept.get(name),
                            keep={"t.duckdb": old_db}))
        elif name in good:
            out.append(Case(EXTREMES, argv, folder, good=True, unsaid="itertrace: note:", rows=good[name],
                            keep={"t.duckdb": old_db}))
        else:
            out.append(Case(EXTREMES, argv, folder, keep={"t.duckdb": old_db}))
    return out


def limit_cases(ws: Workspace, src: Path) -> list[Case]:
    """Workloads past what the engine or the machine holds, each run by a real `itertrace run` (or experiment)."""
    src.mkdir(parents=True, exist_ok=True)
    (src / "too-long.jsonl").write_text(json.dumps({"timestamp": 0, "input_length": 3, "output_length": 2**31 - 1}))
    synthetic = ["run", "--workload", "synthetic"]
    refused = [
        [*synthetic, "--rate", "1e-300"],
        [*synthetic, "--num-requests", "4", "--rate", "1e-10"],
        [*synthetic, "--cv", "1e-300"],
        [*synthetic, "--rate", "1", "--cv", "1e300"],
        [*synthetic, "--output-len", "1000000000", "--num-requests", "1"],
        [*synthetic, "--prompt-len", "70000"],
        [*synthetic, "--prompt-len", "600", "--no-chunked-prefill", "--token-budget", "512"],
        [*synthetic, "--num-requests", "1000000000"],
        ["run", "--workload", "slot-time-uniform", "--num-requests", "1000000000"],
        ["experiment", "slot-time", "--requests", "1000000000"],
        ["run", "--workload", str(src / "too-long.jsonl")],
    ]
    out = []
    for argv in refused:
        folder = ws.folder()
        out.append(Case(LIMITS, [*argv, "--out", str(folder / "run")], folder, never=(folder / "run",)))
    folder = ws.folder()
    out.append(Case(LIMITS, [*synthetic, "--output-len", "choice:16,100000@0.5,0.5", "--num-requests", "8", "--out",
                             str(folder / "run")], folder, good=True, says="requests are rejected on arrival"))
    return out


# Categories made by their own builders, without `prepare`'s run, exports and databases.
OWN_INPUTS: dict[str, Callable[[Workspace, Path], list[Case]]] = {EXTREMES: extreme_cases, LIMITS: limit_cases}


def prepare(src: Path) -> None:
    """The sources the cases read: a run, its database, exports, and the bad files."""
    subprocess.run([*CLI, "run", "--workload", "worked-example", "--out", str(src / "run")], check=True,
                   capture_output=True)
    subprocess.run([*CLI, "ingest", str(src / "run"), "--db", str(src / "run.duckdb"), "--quiet"], check=True)
    with duckdb.connect(str(src / "old.duckdb")) as con:
        con.execute("CREATE TABLE keep_me AS SELECT 42 AS answer")
    arrow_export(src / "small.arrow", 50)
    arrow_export(src / "big.arrow", 200_000)
    subprocess.run([*CLI, "ingest", str(src / "big.arrow"), "--db", str(src / "big.duckdb"), "--quiet"], check=True)
    with duckdb.connect(str(src / "big.duckdb"), read_only=True) as con:
        (src / "big.tables").write_text(str(con.execute("SELECT count(*) FROM duckdb_tables()").fetchone()[0]))
    pq.write_table(pa.table({"x": [1, 2, 3]}), src / "p.parquet")
    (src / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (src / "huge.jsonl").write_text('{"timestamp": 0, "input_length": 1e300, "output_length": 3}\n')
    shutil.copytree(src / "run", src / "seed.run")
    meta = json.loads((src / "seed.run" / "run.json").read_text())
    meta["seed"] = 10**30
    (src / "seed.run" / "run.json").write_text(json.dumps(meta))
    shutil.copy(src / "run.duckdb", src / "varchar.duckdb")
    with duckdb.connect(str(src / "varchar.duckdb")) as con:
        con.execute("CREATE TABLE nvtx_ranges AS SELECT 'x' AS start_ns, 'y' AS end_ns, 'step' AS text")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--only", metavar="WORDS", help="only the categories whose name holds WORDS, e.g. 'extremes'")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="itertrace-adversarial-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    (root / "src").mkdir()
    ws = Workspace(root)
    tallies: dict[str, Tally] = {}
    started = time.monotonic()
    try:
        chosen: list[Case] = []
        if args.only is None or not any(args.only in name for name in OWN_INPUTS):
            prepare(root / "src")
            chosen += cases(ws, root / "src")
        for name, build in OWN_INPUTS.items():
            if args.only is None or args.only in name:
                chosen += build(ws, root / "src" / name.split()[0])
        for case in (c for c in chosen if args.only is None or args.only in c.category):
            status, err, lost, read = run(case)
            judge(case, status, err, lost, read, tallies.setdefault(case.category, Tally()))
    finally:
        ws.close()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    total = Counter()
    print(f"{'category':<52} {'cases':>5} {'clean':>5} {'traceback':>9} {'lost':>4} {'left':>4} {'read':>4} "
          f"{'accepted':>8}  exits")
    for name, t in sorted(tallies.items(), key=lambda kv: int(re.match(r"\d+", kv[0]).group())):
        exits = " ".join(f"{status}x{n}" for status, n in sorted(t.exits.items()))
        print(f"{name:<52} {t.cases:>5} {t.clean:>5} {t.tracebacks:>9} {t.lost:>4} {t.leftovers:>4} {t.read:>4} "
              f"{t.accepted:>8}  {exits}")
        total.update(cases=t.cases, clean=t.clean, tracebacks=t.tracebacks, lost=t.lost, leftovers=t.leftovers,
                     read=t.read)
        for note in t.notes:
            print(f"    {note}")
    print(f"{'all':<52} {total['cases']:>5} {total['clean']:>5} {total['tracebacks']:>9} {total['lost']:>4} "
          f"{total['leftovers']:>4} {total['read']:>4}   in {time.monotonic() - started:.0f} s")
    print(f"tracebacks {total['tracebacks']}, data lost {total['lost']}, leftovers {total['leftovers']}, "
          f"files read {total['read']}")
    return 1 if total["tracebacks"] or total["lost"] or total["leftovers"] or total["read"] else 0


if __name__ == "__main__":
    sys.exit(main())
