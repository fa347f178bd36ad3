"""The `auto` mapping: which preset or suggested range maps a capture's iterations, and a preset that does not fit.

`choose_mapping` runs once per connection, after the parameters are set: with `preset=auto` (or no
preset) it picks the first preset (queries/presets.toml, in order) whose iteration range is present,
else the range `mapping_suggest` ranks first, and sets the session variables that say so; an engine's
name picks the first of that engine's presets present; a preset whose iteration range is not in the
capture is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import duckdb

from itertrace.errors import UserError
from itertrace.queries.presets import AUTO, GENERIC, Preset, engine_presets, presets

# A suggestion scoring under this is no iteration: it covers under 5% of the GPU work (or of its
# threads' time), or comes at a pace too irregular, to stand for one.
MIN_SCORE = 0.05
CHOOSING = ("iterations_steps", "mapping_suggest")  # the views choose_mapping reads


@dataclass(frozen=True)
class MappingChoice:
    """What `auto` (or an engine's name) chose, and the parameters that choose the same mapping explicitly."""

    preset: str
    params: dict[str, str]
    ranges: int  # step ranges it maps; 0 when it found none
    name: str | None  # the step ranges' name (digits as #); None when it found none
    asked: str = AUTO  # what --param preset said: auto, or the engine it resolved

    @property
    def param_line(self) -> str:
        """The parameters as itertrace's commands take them, e.g. `--param preset=vllm`."""
        return " ".join(f"--param {k}={_quote(v)}" for k, v in self.params.items())

    @property
    def note(self) -> str:
        """One line for a person: which mapping it chose, on what evidence, and how to choose it yourself."""
        if not self.ranges:
            return ("mapping: auto found no range that repeats like an iteration, so there are no iterations; "
                    "`itertrace mapping suggest --db FILE` lists the candidates")
        what = {"itertrace": "this engine's `step` ranges", GENERIC: "the best suggested range"}.get(
            self.preset, f"the {self.preset} preset")
        return (f"mapping: {self.asked} chose {what}: {self.ranges:,} step ranges named {self.name!r} "
                f"(the same explicitly: {self.param_line})")


def choose_mapping(con: duckdb.DuckDBPyConnection, params: dict[str, str]) -> MappingChoice | None:
    """Resolve `preset=auto` (the default) or an engine's name into session variables; None when the caller
    chose one preset (or the generic mapping).

    A preset (or an engine none of whose presets) whose iteration range is not in the capture is a
    UserError naming the patterns and domains it looked for.
    """
    asked = params.get("preset", AUTO)
    if asked == GENERIC:
        return None
    if asked != AUTO:
        candidates = engine_presets(asked)
        present = next((p for p in candidates if _present(con, p)), None)
        if present is None:
            looked = "; ".join(f"{p.step!r} " + (f"in domain {p.domain!r}" if p.domain else "in any domain")
                               for p in candidates)
            raise UserError(f"preset {asked}: no NVTX range or stack frame in this capture matches its iteration "
                            f"range ({looked}); `itertrace mapping suggest --db FILE` ranks the ranges that "
                            "could be one")
        if len(candidates) == 1:
            return None
        return _choose(con, {"preset": present.name}, asked)
    if "step_pattern" in params:  # a pattern of one's own is the generic mapping
        return _choose(con, {"preset": GENERIC}, asked)
    present = next((p for p in presets() if _present(con, p)), None)
    chosen = {"preset": present.name} if present else _best_suggestion(con) or {"preset": AUTO}
    return _choose(con, chosen, asked)


def set_choice(con: duckdb.DuckDBPyConnection, chosen: dict[str, str]) -> None:
    """Set the session variables of the mapping `chosen` (MappingChoice.params)."""
    for name, value in chosen.items():
        con.execute(f'SET VARIABLE "{name}" = ?', [value])


def _choose(con: duckdb.DuckDBPyConnection, chosen: dict[str, str], asked: str) -> MappingChoice:
    set_choice(con, chosen)
    ranges, name = con.execute("""
        SELECT count(*), mode(regexp_replace(r.text, '[0-9]+', '#', 'g'))
        FROM iterations_steps AS s JOIN nvtx_ranges AS r USING (range_id)""").fetchall()[0]
    return MappingChoice(chosen["preset"], chosen, ranges if chosen["preset"] != AUTO else 0, name, asked=asked)


def _present(con: duckdb.DuckDBPyConnection, preset: Preset) -> bool:
    return _matching(con, preset.step, preset.domain)[0] > 0


def _best_suggestion(con: duckdb.DuckDBPyConnection) -> dict[str, str] | None:
    """The generic mapping of the range mapping_suggest ranks first, if it scores at least MIN_SCORE."""
    rows = con.execute("SELECT step_pattern, domain, score FROM mapping_suggest ORDER BY rank LIMIT 1").fetchall()
    if not rows or rows[0][2] < MIN_SCORE:
        return None
    pattern, domain, _ = rows[0]
    return {"preset": GENERIC, "step_pattern": pattern} | ({"domain": domain} if domain else {})


def _matching(con: duckdb.DuckDBPyConnection, pattern: str | None, domain: str | None) -> tuple[int, str | None]:
    """How many NVTX ranges match `pattern` in `domain` (any domain when None), and their commonest name."""
    if pattern is None:
        return 0, None
    count, name = con.execute("""
        WITH
          texts AS (SELECT text, domain_name, count(*) AS n FROM nvtx_ranges GROUP BY ALL),
          matched AS (
            SELECT regexp_replace(text, '[0-9]+', '#', 'g') AS name, sum(n) AS n
            FROM texts
            WHERE regexp_matches(text, ?) AND (?::VARCHAR IS NULL OR domain_name = ?)
            GROUP BY ALL)
        SELECT coalesce(sum(n), 0)::BIGINT, arg_max(name, n) FROM matched""", [pattern, domain, domain]).fetchall()[0]
    return count, name


def _quote(value: str) -> str:
    """`value` as a shell word: quoted when it holds anything but letters, digits and -_.:"""
    if value and all(c.isalnum() or c in "-_.:" for c in value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"
