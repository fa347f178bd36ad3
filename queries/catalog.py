"""The query library as files: each `.sql` module's views, macros, parameters and what it reads.

A module is one `.sql` file that only defines things (macros and views) and produces nothing when
run. Its first comment block documents it; `-- @param NAME TYPE [(a|b) or (>=N)] text` lines declare the
parameters its views read with `getvariable('NAME')`, and `-- @uses NAME, NAME` the other modules it
reads (the installation order; a test checks the declaration against what DuckDB binds). Public views
are named after their module (`host_gaps`, `host_gaps_parts`, ...); helpers start with `_`. Which
definitions and which database tables a definition reads is found from the names in its SQL, so the
tables a query needs are never written down twice.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from itertrace.ingest.sqldoc import TableDoc, statements, table_docs
from itertrace.queries import presets

SQL_DIR = Path(__file__).parent

# Tables that `itertrace ingest` writes and that modules may read, with where they come from.
NSYS = "an Nsight Systems capture (itertrace ingest REPORT.nsys-rep --db FILE)"
RUN = "an engine run directory (itertrace ingest RUN_DIR --db FILE)"
SOURCE_TABLES: dict[str, str] = {
    "nvtx_ranges": NSYS, "nvtx_marks": NSYS, "nvtx_gpu_projection": NSYS, "cuda_api": NSYS, "gpu_ops": NSYS,
    "threads": NSYS, "processes": NSYS, "capture_meta": NSYS, "capture_spans": NSYS,
    "run_iterations": RUN, "run_events": RUN, "run_requests": RUN, "run_meta": RUN,
}
# Tables that a database of an older ingest lacks, with their columns: an empty one stands in for each, so
# that the views that read it work there as on a capture that recorded none.
OPTIONAL_TABLES: dict[str, str] = {"capture_spans": "global_pid BIGINT, start_ns BIGINT, end_ns BIGINT, source VARCHAR"}

_PARAM = re.compile(r"^--\s*@param\s+(\w+)\s+(VARCHAR|BIGINT|DOUBLE)\s+(?:\((?:>=(-?\d+)|([\w|-]+))\)\s+)?(.*)$")
_DEFINES = re.compile(r"^CREATE (MACRO|VIEW) (\w+)", re.IGNORECASE | re.MULTILINE)
_READS = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)", re.IGNORECASE)
_CALLS = re.compile(r"\b(\w+)\(")
_VARIABLES = re.compile(r"getvariable\('(\w+)'\)")
_USES = re.compile(r"^--\s*@uses\s+(.*)$")


@dataclass(frozen=True)
class Param:
    """A parameter a module's views read through getvariable()."""

    name: str
    type: str  # VARCHAR, BIGINT or DOUBLE
    choices: tuple[str, ...]  # allowed values; empty for any
    doc: str
    minimum: int | None = None  # BIGINT: the least value allowed; None for any


@dataclass(frozen=True)
class Definition:
    """One macro or view of a module: the statement that creates it and the names it reads."""

    name: str
    module: str
    kind: str  # VIEW or MACRO
    statement: str
    reads: frozenset[str]  # views, tables and macros it names
    variables: frozenset[str]  # parameters it reads with getvariable()


@dataclass(frozen=True)
class Module:
    """One `.sql` file of the library."""

    name: str
    doc: str
    sql: str
    statements: tuple[str, ...]
    views: tuple[TableDoc, ...]  # its public views, documented
    params: tuple[Param, ...]
    uses: tuple[str, ...]  # modules it reads, directly, as its header declares them
    definitions: tuple[Definition, ...]  # in file order


def _code(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def _header(sql: str) -> tuple[str, tuple[Param, ...], tuple[str, ...]]:
    """The first paragraph of the file's leading comment, and the parameters and modules it declares."""
    lines: list[str] = []
    params: list[Param] = []
    uses: list[str] = []
    paragraph_done = False
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        text = line[2:].strip()
        if m := _USES.match(line):
            uses += [name.strip() for name in m.group(1).split(",")]
        elif m := _PARAM.match(line):
            choices = tuple(m.group(4).split("|")) if m.group(4) else ()
            minimum = int(m.group(3)) if m.group(3) is not None else None
            params.append(Param(m.group(1), m.group(2), choices, m.group(5).strip(), minimum))
        elif not text:
            paragraph_done = paragraph_done or bool(lines)
        elif not paragraph_done:
            lines.append(text)
    return " ".join(lines), tuple(params), tuple(uses)


@cache
def modules() -> tuple[Module, ...]:
    """Every module, each after the modules it uses."""
    raw = {path.stem: path.read_text() for path in sorted(SQL_DIR.glob("*.sql"))}
    raw[presets.MODULE] = presets.module_sql()  # made from presets.toml
    out: dict[str, Module] = {}
    for name, sql in raw.items():
        doc, params, uses = _header(sql)
        if unknown := [used for used in uses if used not in raw or used == name]:
            raise RuntimeError(f"queries/{name}.sql: @uses names no other module: {', '.join(unknown)}")
        views = tuple(d for d in table_docs(sql) if d.kind == "VIEW" and not d.table.startswith("_"))
        stmts = tuple(statements(sql))
        definitions = tuple(_definition(name, statement) for statement in stmts)
        out[name] = Module(name, doc, sql, stmts, views, params, uses, definitions)
    ordered: list[Module] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise RuntimeError(f"query modules use each other in a cycle: {' -> '.join(path + (name,))}")
        if any(m.name == name for m in ordered):
            return
        for used in out[name].uses:
            visit(used, path + (name,))
        ordered.append(out[name])

    for name in out:
        visit(name, ())
    return tuple(ordered)


def _definition(module_name: str, statement: str) -> Definition:
    code = _code(statement)
    created = _DEFINES.search(code)
    if created is None:
        raise RuntimeError(f"queries/{module_name}.sql: a statement that defines no macro or view:\n{statement}")
    reads = set(_READS.findall(code)) | set(_CALLS.findall(code))
    return Definition(created.group(2), module_name, created.group(1).upper(), statement,
                      frozenset(reads - {created.group(2)}), frozenset(_VARIABLES.findall(code)))


@cache
def definitions() -> dict[str, Definition]:
    """Every macro and view of the library, by name, in installation order."""
    return {d.name: d for m in modules() for d in m.definitions}


def needed(names: Iterable[str]) -> tuple[Definition, ...]:
    """The definitions among `names` and those they read, directly or through others, in installation order."""
    defs = definitions()
    seen: set[str] = set()
    todo = [n for n in names if n in defs]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [read for read in defs[name].reads if read in defs]
    return tuple(d for d in defs.values() if d.name in seen)


def requires(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The source tables and the parameters the definition `name` reads, directly or through others."""
    defs = definitions()
    seen: set[str] = set()
    tables: dict[str, None] = {}
    variables: dict[str, None] = {}

    def walk(n: str) -> None:
        if n in seen:
            return
        seen.add(n)
        d = defs[n]
        variables.update(dict.fromkeys(sorted(d.variables)))
        for read in sorted(d.reads):
            if read in defs:
                walk(read)
            elif read in SOURCE_TABLES:
                tables[read] = None

    walk(name)
    return tuple(tables), tuple(variables)


@dataclass(frozen=True)
class Query:
    """A public view: what `itertrace query NAME` runs."""

    name: str
    module: Module
    doc: TableDoc

    @property
    def summary(self) -> str:
        """The first sentence of its documentation."""
        text = self.doc.text
        end = text.find(". ")
        return text if end < 0 else text[: end + 1]

    @property
    def tables(self) -> tuple[str, ...]:
        """Source tables it reads, directly or through other views."""
        return requires(self.name)[0]

    @property
    def params(self) -> tuple[Param, ...]:
        """Parameters it reads, directly or through other views and macros."""
        reads = set(requires(self.name)[1])
        return tuple(p for p in all_params().values() if p.name in reads)

    @property
    def uses_mapping(self) -> bool:
        return any(p.name == "step_pattern" for p in self.params)


@cache
def queries() -> dict[str, Query]:
    """Every public view, by name, in module order."""
    return {doc.table: Query(doc.table, m, doc) for m in modules() for doc in m.views}


def all_params() -> dict[str, Param]:
    return {p.name: p for m in modules() for p in m.params}
