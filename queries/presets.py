"""The mapping presets (presets.toml) as data, and the SQL module made from them.

Every place that knows an engine's names reads them from here: the macros of the mapping (the module
`mapping_presets`, made by `module_sql`), the values `--param preset` takes, the order `auto` tries
them in (queries/suggest.py) and the list in README.md (`markdown`, between the README's `presets` markers; a
test checks it, and `python -m itertrace.queries.presets README.md` rewrites it).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PRESETS_FILE = Path(__file__).with_name("presets.toml")
MODULE = "mapping_presets"
# The columns a step's text can carry (step_counts), with their SQL types.
COUNT_COLUMNS = {"mode": "VARCHAR", "batch_size": "BIGINT", "tokens": "BIGINT", "prefill_requests": "BIGINT",
                 "prefill_tokens": "BIGINT", "decode_requests": "BIGINT", "decode_tokens": "BIGINT",
                 "context_tokens": "BIGINT"}
ITERATION_FROM = ("payload", "text", "order")
RANGES = ("nvtx", "annotations", "frames")
AUTO, GENERIC = "auto", "generic"  # the two values of --param preset that are no row


@dataclass(frozen=True)
class Counts:
    """A pattern of a step's text, and the step_counts column each capture group fills (a column named
    twice takes the sum)."""

    pattern: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Preset:
    """One engine and source of names: the ranges that are an iteration and its phases."""

    name: str
    engine: str
    source: str
    ranges: str  # nvtx, annotations or frames
    step: str
    domain: str | None
    phases: str
    device: str | None
    iteration_from: str
    counts: tuple[Counts, ...]
    capture: str
    finds: str
    names_from: str


@cache
def presets() -> tuple[Preset, ...]:
    """Every preset, in the order `auto` tries them."""
    rows = tomllib.loads(PRESETS_FILE.read_text())["preset"]
    found = tuple(_preset(row) for row in rows)
    if missing := {p.engine for p in found} - set(engine_labels()):
        raise RuntimeError(f"{PRESETS_FILE}: engines without a name in [engines]: {sorted(missing)}")
    names = [p.name for p in found]
    if len(set(names)) != len(names) or {AUTO, GENERIC} & set(names):
        raise RuntimeError(f"{PRESETS_FILE}: preset names must be unique and not auto or generic: {names}")
    return found


@cache
def engine_labels() -> dict[str, str]:
    """Each engine's name as the README writes it, in the README's order."""
    return dict(tomllib.loads(PRESETS_FILE.read_text()).get("engines", {}))


def _preset(row: dict) -> Preset:
    where = f"{PRESETS_FILE}: preset {row.get('name')!r}"
    if row["iteration_from"] not in ITERATION_FROM:
        raise RuntimeError(f"{where}: iteration_from must be one of {', '.join(ITERATION_FROM)}")
    if row["ranges"] not in RANGES:
        raise RuntimeError(f"{where}: ranges must be one of {', '.join(RANGES)}")
    counts = tuple(Counts(c["pattern"], tuple(c["columns"])) for c in row["counts"])
    for c in counts:
        if unknown := set(c.columns) - set(COUNT_COLUMNS):
            raise RuntimeError(f"{where}: unknown count columns {sorted(unknown)}")
    return Preset(row["name"], row["engine"], row["source"], row["ranges"], row["step"], row["domain"] or None, row["phases"],
                  row["device"] or None, row["iteration_from"], counts, row["capture"], row["finds"],
                  row["names_from"])


def choices() -> tuple[str, ...]:
    """What --param preset takes: auto, generic, each preset, and each engine (its first preset present)."""
    engines = tuple(dict.fromkeys(p.engine for p in presets() if p.engine not in {q.name for q in presets()}))
    return (AUTO, GENERIC, *(p.name for p in presets()), *engines)


def engine_presets(name: str) -> tuple[Preset, ...]:
    """The presets `--param preset=name` may mean: that preset, else every preset of that engine, in order."""
    exact = tuple(p for p in presets() if p.name == name)
    if exact and not any(p.engine == name and p.name != name for p in presets()):
        return exact
    return tuple(p for p in presets() if p.engine == name)


def _literal(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


def _case(field: str) -> str:
    whens = " ".join(f"WHEN {_literal(p.name)} THEN {_literal(getattr(p, field))}" for p in presets())
    return f"CASE preset {whens} END"


def _counts_struct(counts: Counts) -> str:
    """The step_counts struct of one pattern: each column from its group(s), the others NULL."""
    fields = []
    for column, kind in COUNT_COLUMNS.items():
        groups = [i + 1 for i, c in enumerate(counts.columns) if c == column]
        if not groups:
            fields.append(f"'{column}': NULL::{kind}")
            continue
        values = [f"nullif(regexp_extract(text, {_literal(counts.pattern)}, {g}), '')" for g in groups]
        if kind == "VARCHAR":
            fields.append(f"'{column}': {values[0]}")
        else:
            fields.append(f"'{column}': " + " + ".join(f"try_cast({v} AS BIGINT)" for v in values))
    return "{" + ", ".join(fields) + "}"


def _counts_macro() -> str:
    whens = []
    for p in presets():
        for c in p.counts:
            whens.append(f"WHEN preset = {_literal(p.name)} AND regexp_matches(text, {_literal(c.pattern)}) "
                         f"THEN {_counts_struct(c)}")
    empty = "{" + ", ".join(f"'{c}': NULL::{k}" for c, k in COUNT_COLUMNS.items()) + "}"
    return f"CASE {' '.join(whens)} ELSE {empty} END"


def _frame_phases() -> str:
    return "|".join(f"(?:{p.phases})" for p in presets() if p.ranges == "frames") or "$^"


@cache
def module_sql() -> str:
    """The SQL module `mapping_presets`: the presets' macros and their table."""
    names = "|".join(choices())
    rows = ", ".join(f"({i}, {_literal(p.name)}, {_literal(p.engine)}, {_literal(p.source)})"
                     for i, p in enumerate(presets(), start=1))
    return f"""-- Mapping presets: one row per engine and source of names, made from queries/presets.toml (edit that file).
--
-- Each preset names the range that is one iteration, its NVTX domain, the host-phase ranges and how
-- iterations are numbered; mapping.sql reads them through these macros, so that every pattern is a
-- constant when a query runs. The names come from each engine's source (presets.toml says where).
--
-- @param preset VARCHAR ({names}) Mapping preset: a preset, or an engine (its first preset whose iteration range is in the capture); auto when not given (itertrace in a plain DuckDB session).

-- Each preset's iteration range.
CREATE MACRO mapping_preset_step_pattern(preset) AS {_case("step")};

-- Each preset's NVTX domain; NULL for any.
CREATE MACRO mapping_preset_domain(preset) AS {_case("domain")};

-- Each preset's host phases; the first capture group names the phase.
CREATE MACRO mapping_preset_phase_pattern(preset) AS coalesce({_case("phases")}, '');

-- Each preset's device range for a run without GPU work; NULL for none.
CREATE MACRO mapping_preset_device_pattern(preset) AS {_case("device")};

-- How each preset numbers iterations: payload, text or order.
CREATE MACRO mapping_preset_iteration_from(preset) AS coalesce({_case("iteration_from")}, 'order');

-- The frames that stand for an engine's phases (input preparation, the forward pass, sampling, the
-- scheduler): the phases of every preset on Python stack frames, whichever preset is in effect.
CREATE MACRO mapping_preset_frame_phases() AS {_literal(_frame_phases())};

-- The counts a step's text carries under each preset, as a struct of the step_counts columns (NULL where it carries none).
CREATE MACRO mapping_preset_counts(preset, text) AS {_counts_macro()};

-- The presets: one row each, in the order auto tries them.
CREATE VIEW mapping_presets (
  -- Place in the order auto tries the presets, 1 first.
  position,
  -- Preset name, as --param preset=NAME takes it.
  preset,
  -- The engine whose names it holds; --param preset=ENGINE takes the first of its presets present.
  engine,
  -- Where the names come from: NVTX under nsys, torch profiler annotations, or Python stack frames.
  source,
  -- Pattern of the preset's iteration range.
  step_pattern,
  -- NVTX domain of its ranges; NULL for any.
  domain,
  -- Pattern of its host-phase ranges.
  phase_pattern,
  -- Pattern of its device range on a run without GPU work; NULL for none.
  device_pattern,
  -- How it numbers iterations: payload, text or order.
  iteration_from
) AS
SELECT position, p, engine, source, mapping_preset_step_pattern(p), mapping_preset_domain(p), mapping_preset_phase_pattern(p),
       mapping_preset_device_pattern(p), mapping_preset_iteration_from(p)
FROM (VALUES {rows}) AS t(position, p, engine, source)
ORDER BY position;
"""


def markdown() -> str:
    """The presets as the README lists them: a short block per engine, a line per source of its names."""
    out = []
    for engine, label in engine_labels().items():
        out.append(f"**{label}**")
        for p in (p for p in presets() if p.engine == engine):
            out.append(f"- `preset={p.name}`, {p.source}. Capture: {p.capture}. Finds: {p.finds}.")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


BEGIN, END = "<!-- presets: made from queries/presets.toml -->", "<!-- end of presets -->"


def with_readme_block(readme: str) -> str:
    """`readme` with the text between its presets markers replaced by `markdown()`."""
    head, sep, rest = readme.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


if __name__ == "__main__":
    import sys

    target = Path(sys.argv[1])
    target.write_text(with_readme_block(target.read_text()))
