"""Each SQL module declares the modules it reads (`-- @uses` in its header): the declaration is what its
definitions name, and with only the declared modules created before it, DuckDB binds every view of it."""
from __future__ import annotations

import duckdb
import pytest

from itertrace.queries.catalog import definitions, modules
from itertrace.queries.library import create
from query_fixtures import create_statements


def _used(name: str) -> list[str]:
    """The modules `name` uses, directly or through others, each after those it uses, then `name`."""
    by_name = {m.name: m for m in modules()}
    order: list[str] = []

    def visit(module: str) -> None:
        for used in by_name[module].uses:
            visit(used)
        if module not in order:
            order.append(module)

    visit(name)
    return order


def test_each_module_declares_the_modules_its_definitions_read():
    defs = definitions()
    for mod in modules():
        read = {defs[r].module for d in mod.definitions for r in d.reads if r in defs} - {mod.name}
        assert set(mod.uses) == read, mod.name


def test_no_module_reads_another_modules_private_helper():
    defs = definitions()
    crossed = sorted(f"{d.module} reads {r} of {defs[r].module}" for mod in modules() for d in mod.definitions
                     for r in d.reads if r in defs and r.startswith("_") and defs[r].module != d.module)
    assert crossed == []


def test_each_definition_is_named_after_its_module():
    # a module of a plural name may name its parts in the singular (mapping_presets: mapping_preset_domain)
    misnamed = sorted(f"{d.module}: {d.name}" for mod in modules() for d in mod.definitions
                      if not d.name.lstrip("_").startswith((d.module, d.module.removesuffix("s") + "_")))
    assert misnamed == []


@pytest.mark.parametrize("name", [m.name for m in modules()])
def test_a_module_binds_with_only_the_modules_it_declares(name):
    con = duckdb.connect()
    for statement in create_statements():
        con.execute(statement)
    by_name = {m.name: m for m in modules()}
    for module in _used(name):  # created as `query --install` creates them: bound, so a missing name fails
        create(con, by_name[module].definitions, {}, persist=True)
    views = [d.name for d in by_name[name].definitions if d.kind == "VIEW"]
    assert {row[0] for row in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()} \
        >= set(views)
