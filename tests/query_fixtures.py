"""Small databases for the query diff tests: the tables ingest creates, holding a handful of rows.

`make_db(path, {"nvtx_ranges": [push_pop(...), ...], ...})` creates every table that `itertrace
ingest` creates, with the same columns and types (read from ingest's own SQL and run schema), and
inserts the rows given; a row is a dict of the columns it sets, every other column is NULL.
`TraceDB` holds the same tables in memory with the query library installed once, for a test file
whose tests each load their own rows and run one view.
"""
from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa

import itertrace.ingest
from itertrace.ingest.run_schema import META_COLUMNS, RUN_TABLES, Kind
from itertrace.ingest.sqldoc import statements
from itertrace.queries import QueryDB, set_params
from itertrace.queries.catalog import all_params, definitions

INGEST_SQL = Path(itertrace.ingest.__file__).parent / "sql"
DUCKDB_TYPES = {Kind.INT: "BIGINT", Kind.TEXT: "VARCHAR", Kind.BOOL: "BOOLEAN", Kind.INT_LIST: "BIGINT[]"}

# Threads as nsys numbers them (<hw:8><vm:8><pid:24><tid:24>): A and B in process 100, C in process 200.
TID_A = (1 << 48) | (100 << 24) | 100
TID_B = (1 << 48) | (100 << 24) | 101
TID_C = (1 << 48) | (200 << 24) | 200
PID_100 = TID_A & ~0xFFFFFF
PID_200 = TID_C & ~0xFFFFFF


def pid_of(tid: int) -> int:
    return tid & ~0xFFFFFF


def create_statements() -> list[str]:
    """CREATE TABLE for every table ingest writes: nsys tables from ingest/sql, run tables from the run schema.

    A normalized view (nvtx_ranges, nvtx_marks: the names of threads and domains looked up over a narrower
    hidden table) becomes a table of the same columns and types, so that a test can insert the rows a
    query reads without the lookups; the fingerprint tests check the views against what they replaced."""
    out, views = [], {}
    for file in sorted(INGEST_SQL.glob("*.sql")):
        for statement in statements(file.read_text()):
            code = "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
            if re.match(r"\s*CREATE TABLE ", code):
                out.append(code)
            elif view := re.match(r"\s*CREATE VIEW (\w+) ", code):
                views[view.group(1)] = code
    hidden = [name for code in out if (name := code.split()[2]).startswith("_")]
    for view, code in views.items():  # after every table they read
        out += [code, f"CREATE TABLE _{view}_shape AS SELECT * FROM {view} LIMIT 0", f"DROP VIEW {view}",
                f"ALTER TABLE _{view}_shape RENAME TO {view}"]
    out += [f"DROP TABLE {name}" for name in hidden]
    for spec in RUN_TABLES:
        columns = ", ".join(f'"{name}" {DUCKDB_TYPES[kind]}' for name, (kind, _) in spec.columns.items())
        out.append(f"CREATE TABLE {spec.table} ({columns})")
    meta = ", ".join(f'"{name}" {kind}' for name, kind, _ in META_COLUMNS)
    out.append(f"CREATE TABLE run_meta ({meta})")
    return out


def insert(con: duckdb.DuckDBPyConnection, tables: dict[str, list[dict]]) -> None:
    """Insert each row (a dict of the columns it sets) into its table; unset columns stay NULL."""
    for table, rows in tables.items():
        groups: dict[tuple[str, ...], list[dict]] = {}
        for row in rows:
            groups.setdefault(tuple(row), []).append(row)
        for names, group in groups.items():  # one statement per set of columns: a VALUES list
            values = ", ".join("(" + ", ".join("?" for _ in names) + ")" for _ in group)
            quoted = ", ".join(f'"{name}"' for name in names)
            con.execute(f"INSERT INTO {table} ({quoted}) VALUES {values}", [row[n] for row in group for n in names])


def make_db(path: Path, tables: dict[str, list[dict]] | None = None) -> Path:
    """A DuckDB file at `path` with every ingest table, holding `tables`' rows."""
    con = duckdb.connect(str(path))
    try:
        for statement in create_statements():
            con.execute(statement)
        insert(con, tables or {})
    finally:
        con.close()
    return path


def sorted_rows(table: pa.Table) -> list[tuple]:
    """The rows of `table` as tuples, sorted (NULLs last in each column)."""
    rows = [tuple(row.values()) for row in table.to_pylist()]
    return sorted(rows, key=lambda row: tuple((value is None, value) for value in row))


class TraceDB:
    """Every ingest table in an in-memory database with the query library installed once.

    Installing the library takes a few hundred ms, so a test file opens one TraceDB and each test
    loads its own rows into it (`load` empties every table first) and sets its own parameters
    (`query` resets every parameter first).
    """

    def __init__(self) -> None:
        self.con = duckdb.connect()
        for statement in create_statements():
            self.con.execute(statement)
        self.tables = [row[0] for row in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        self.db = QueryDB("test.duckdb", con=self.con)
        self.db.need(definitions())  # every view, and the mapping chosen, before a test sets its parameters

    def __enter__(self) -> TraceDB:
        return self

    def __exit__(self, *exc) -> None:
        self.db.close()

    def load(self, tables: dict[str, list[dict]] | None = None) -> TraceDB:
        """Replace the contents of every table by `tables`' rows."""
        for table in self.tables:
            self.con.execute(f"DELETE FROM {table}")
        insert(self.con, tables or {})
        return self

    def query(self, name: str, params: dict[str, str] | None = None) -> list[tuple]:
        """The rows of the public view `name` under `params`, sorted."""
        self._set(params)
        return sorted_rows(self.db.query(name))

    def sql(self, text: str, params: dict[str, str] | None = None) -> list[tuple]:
        """The rows of any SQL over the tables and the installed views under `params`, sorted."""
        self._set(params)
        return sorted_rows(self.db.sql(text))

    def _set(self, params: dict[str, str] | None) -> None:
        for name in all_params():
            self.con.execute(f'RESET VARIABLE "{name}"')
        set_params(self.con, params or {})


# Row builders: the columns a query reads, by keyword; everything else stays NULL.

def push_pop(range_id: int, text: str, start_ns: int, end_ns: int | None, *, tid: int = TID_A,
             parent: int | None = None, depth: int = 0, payload: int | None = None,
             domain: str | None = "itertrace") -> dict:
    """An nvtx_ranges push/pop range; `parent` and `depth` must describe its nesting on `tid`."""
    return {"range_id": range_id, "range_kind": "push_pop", "start_ns": start_ns, "end_ns": end_ns,
            "dur_ns": None if end_ns is None else end_ns - start_ns, "text": text, "domain_name": domain,
            "global_tid": tid, "global_pid": pid_of(tid), "int64_value": payload,
            "parent_range_id": parent, "depth": depth}


def step(range_id: int, iteration: int, start_ns: int, end_ns: int | None, *, tid: int = TID_A) -> dict:
    """This engine's iteration range: a `step` push/pop range at depth 0 whose payload is the iteration."""
    return push_pop(range_id, "step", start_ns, end_ns, payload=iteration, tid=tid)


def phase(range_id: int, name: str, start_ns: int, end_ns: int | None, parent: int, *, depth: int = 1,
          tid: int = TID_A) -> dict:
    """A host phase range inside `parent` (a step, at depth 0, unless `depth` says otherwise)."""
    return push_pop(range_id, name, start_ns, end_ns, parent=parent, depth=depth, tid=tid)


def start_end(range_id: int, text: str, start_ns: int, end_ns: int | None, *, tid: int = TID_A,
              payload: int | None = None, domain: str | None = "itertrace") -> dict:
    """An nvtx_ranges start/end range: no parent, no depth."""
    row = push_pop(range_id, text, start_ns, end_ns, tid=tid, payload=payload, domain=domain)
    return {**row, "range_kind": "start_end", "depth": None}


def frame(range_id: int, text: str, start_ns: int, end_ns: int, *, tid: int = TID_A, parent: int | None = None,
          depth: int = 0) -> dict:
    """A Python stack frame (a torch profiler trace's python_function event), named `path(line): function`."""
    return {**push_pop(range_id, text, start_ns, end_ns, tid=tid, parent=parent, depth=depth, domain=None),
            "range_kind": "python_frame"}


def mark(mark_id: int, text: str, ts_ns: int, payload: int, *, tid: int = TID_A,
         domain: str | None = "itertrace") -> dict:
    """An nvtx_marks row."""
    return {"mark_id": mark_id, "ts_ns": ts_ns, "text": text, "domain_name": domain, "global_tid": tid,
            "global_pid": pid_of(tid), "int64_value": payload}


def api_call(api_id: int, start_ns: int, end_ns: int, correlation_id: int, *, tid: int = TID_A) -> dict:
    """A cuda_api row."""
    return {"api_id": api_id, "start_ns": start_ns, "end_ns": end_ns, "dur_ns": end_ns - start_ns,
            "name": "cudaLaunchKernel_v7000", "global_tid": tid, "global_pid": pid_of(tid),
            "correlation_id": correlation_id}


def gpu_op(gpu_op_id: int, start_ns: int, end_ns: int, correlation_id: int, *, pid: int = PID_100) -> dict:
    """A gpu_ops kernel row."""
    return {"gpu_op_id": gpu_op_id, "kind": "kernel", "start_ns": start_ns, "end_ns": end_ns,
            "dur_ns": end_ns - start_ns, "correlation_id": correlation_id, "global_pid": pid}


def projection(range_id: int, gpu_start_ns: int, gpu_end_ns: int, ops: int, launches: int | None = None) -> dict:
    """An nvtx_gpu_projection row: the GPU work launched inside range `range_id`."""
    return {"range_id": range_id, "gpu_start_ns": gpu_start_ns, "gpu_end_ns": gpu_end_ns,
            "gpu_dur_ns": gpu_end_ns - gpu_start_ns, "gpu_op_count": ops,
            "launch_count": ops if launches is None else launches}
