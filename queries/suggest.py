"""The `auto` mapping: which preset or suggested range maps a capture's iterations, and a preset that does not fit.

`choose_mapping` runs once per connection, after the parameters are set: with `preset=auto` (or no
preset) it picks this engine's names where present, else a known engine's preset whose iteration
range is present, else the range `mapping_suggest` ranks first, and sets the session variables that
say so; with a named preset it checks that the preset's iteration range is in the capture.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import duckdb

from itertrace.errors import UserError

# A suggestion scoring under this is no iteration: it covers under 5% of the GPU work (or of its
# threads' time), or comes at a pace too irregular, to stand for one.
MIN_SCORE = 0.05


class Preset(enum.Enum):
    """The values of the `preset` parameter."""

    AUTO = "auto"
    ITERTRACE = "itertrace"
    GENERIC = "generic"
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


@dataclass(frozen=True)
class MappingChoice:
    """What `auto` chose, and the parameters that choose the same mapping explicitly."""

    preset: Preset
    params: dict[str, str]
    ranges: int  # step ranges it maps; 0 when it found none
    name: str | None  # the step ranges' name (digits as #); None when it found none

    @property
    def param_line(self) -> str:
        """The parameters as itertrace's commands take them, e.g. `--param preset=vllm`."""
        return " ".join(f"--param {k}={_quote(v)}" for k, v in self.params.items())

    @property
    def note(self) -> str:
        """One line for a person: which mapping auto chose, on what evidence, and how to choose it yourself."""
        if not self.ranges:
            return ("mapping: auto found no range that repeats like an iteration, so there are no iterations; "
                    "`itertrace mapping suggest --db FILE` lists the candidates")
        what = {Preset.ITERTRACE: "this engine's `step` ranges", Preset.GENERIC: "the best suggested range"}.get(
            self.preset, f"the {self.preset.value} preset")
        return (f"mapping: auto chose {what}: {self.ranges:,} step ranges named {self.name!r} "
                f"(the same explicitly: {self.param_line})")


def choose_mapping(con: duckdb.DuckDBPyConnection, params: dict[str, str]) -> MappingChoice | None:
    """Resolve `preset=auto` (the default) into session variables; None when the caller chose the preset.

    A named preset whose iteration range is not in the capture is a UserError naming the pattern
    and domain it looked for.
    """
    preset = Preset(params.get("preset", Preset.AUTO.value))
    if preset is Preset.GENERIC:
        return None
    if preset is not Preset.AUTO:
        pattern, domain = con.execute("SELECT mapping_step_pattern(), mapping_domain()").fetchall()[0]
        if not _matching(con, pattern, domain)[0]:
            where = f"in domain {domain!r}" if domain else "in any domain"
            raise UserError(f"preset {preset.value}: no NVTX range in this capture matches its iteration range "
                            f"{pattern!r} {where}; `itertrace mapping suggest --db FILE` ranks the ranges that "
                            "could be one")
        return None
    if "step_pattern" in params:  # a pattern of one's own is the generic mapping
        chosen = {"preset": Preset.GENERIC.value}
    else:
        chosen = _preset_present(con) or _best_suggestion(con) or {"preset": Preset.AUTO.value}
    for name, value in chosen.items():
        con.execute(f'SET VARIABLE "{name}" = ?', [value])
    pattern, domain = con.execute("SELECT mapping_step_pattern(), mapping_domain()").fetchall()[0]
    return MappingChoice(Preset(chosen["preset"]), chosen, *_matching(con, pattern, domain))


def _preset_present(con: duckdb.DuckDBPyConnection) -> dict[str, str] | None:
    """The first preset (this engine's first) whose iteration range is in the capture."""
    for preset, pattern, domain in con.execute("SELECT preset, step_pattern, domain FROM mapping_presets").fetchall():
        if _matching(con, pattern, domain)[0]:
            return {"preset": preset}
    return None


def _best_suggestion(con: duckdb.DuckDBPyConnection) -> dict[str, str] | None:
    """The generic mapping of the range mapping_suggest ranks first, if it scores at least MIN_SCORE."""
    rows = con.execute("SELECT step_pattern, domain, score FROM mapping_suggest ORDER BY rank LIMIT 1").fetchall()
    if not rows or rows[0][2] < MIN_SCORE:
        return None
    pattern, domain, _ = rows[0]
    return {"preset": Preset.GENERIC.value, "step_pattern": pattern} | ({"domain": domain} if domain else {})


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
