-- Which NVTX ranges mean an iteration, its device work and its host phases.
--
-- Presets (mapping_presets.sql, made from queries/presets.toml): this engine's names, and those of
-- vLLM, SGLang and TensorRT-LLM, one preset per engine and source of names (NVTX under nsys, torch
-- profiler annotations, Python stack frames), and `generic` (any program with a range per
-- iteration: give its name pattern, e.g. --param step_pattern='^decode_step_\d+$'). `auto`, the
-- default of itertrace's commands, picks one from the capture (queries/suggest.py): the first preset
-- whose iteration range is present, else the range that `mapping_suggest` ranks first; an engine's
-- name picks the first of its presets present. Both are resolved in Python, so a plain DuckDB session
-- that sets no `preset` variable gets the `itertrace` preset. Any key below given as a parameter
-- overrides the preset's value. Patterns are RE2 regular expressions searched in the range's text
-- (anchor them with ^...$ for a whole-name match).
--
-- @param step_pattern VARCHAR Pattern of the range that is one iteration (required with preset=generic).
-- @param domain VARCHAR NVTX domain of the step, phase and device ranges; empty for any domain.
-- @param phase_pattern VARCHAR Pattern of the host-phase ranges; its first capture group, where it matches, names the phase.
-- @param device_pattern VARCHAR Pattern of the range that is an iteration's device work when it launched no GPU work; empty for none.
-- @param iteration_from VARCHAR (payload|text|order) Iteration numbers: the step's int64 payload, the step pattern's first capture group, or 0, 1, ... by start on each thread.
--
-- The mapping is read through macros so that each pattern is a constant when a query runs (a
-- pattern read from a table would be compiled again for every row).
--
-- @uses mapping_presets

CREATE MACRO mapping_preset() AS coalesce(getvariable('preset'), 'itertrace');

CREATE MACRO mapping_step_pattern() AS coalesce(getvariable('step_pattern'), mapping_preset_step_pattern(mapping_preset()));

CREATE MACRO mapping_domain() AS CASE
  WHEN getvariable('domain') IS NOT NULL THEN nullif(getvariable('domain'), '')
  ELSE mapping_preset_domain(mapping_preset()) END;

CREATE MACRO mapping_phase_pattern() AS coalesce(getvariable('phase_pattern'), mapping_preset_phase_pattern(mapping_preset()));

CREATE MACRO mapping_device_pattern() AS CASE
  WHEN getvariable('device_pattern') IS NOT NULL THEN nullif(getvariable('device_pattern'), '')
  ELSE mapping_preset_device_pattern(mapping_preset()) END;

CREATE MACRO mapping_iteration_from() AS coalesce(getvariable('iteration_from'), mapping_preset_iteration_from(mapping_preset()));

-- The phase a host range stands for: the phase pattern's first capture group where it has one,
-- else the range's text with each run of digits replaced by #, so that `aten::mul, op_id = 12` and
-- `aten::mul, op_id = 13` are one phase.
CREATE MACRO mapping_phase_name(text) AS coalesce(
  nullif(regexp_extract(text, mapping_phase_pattern(), 1), ''), regexp_replace(text, '[0-9]+', '#', 'g'));

-- The mapping in effect: one row. Querying it fails with a message when the mapping is incomplete.
CREATE VIEW mapping (
  -- Preset the mapping starts from: a preset of mapping_presets, generic, or auto where auto found no iteration range.
  preset,
  -- Pattern of the range that is one iteration (the `step` range); NULL when auto found none.
  step_pattern,
  -- NVTX domain of the step, phase and device ranges; NULL for any.
  domain,
  -- Pattern of the host-phase ranges.
  phase_pattern,
  -- Pattern of the range that is an iteration's device work when it launched no GPU work; NULL for none.
  device_pattern,
  -- How iterations are numbered: payload, text or order.
  iteration_from
) AS
SELECT
  mapping_preset(),
  CASE WHEN mapping_step_pattern() IS NULL AND mapping_preset() = 'generic'
    THEN error('parameter step_pattern is missing: the generic mapping needs the pattern of the iteration range, '
               || 'e.g. --param step_pattern=''^decode_step_\d+$'' (`itertrace mapping suggest --db FILE` ranks the '
               || 'ranges that could be one)')
    ELSE mapping_step_pattern() END,
  mapping_domain(),
  mapping_phase_pattern(),
  mapping_device_pattern(),
  CASE WHEN mapping_iteration_from() IN ('payload', 'text', 'order') THEN mapping_iteration_from()
    ELSE error('parameter iteration_from must be payload, text or order, not ' || mapping_iteration_from()) END;
