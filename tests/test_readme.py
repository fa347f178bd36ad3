"""The README is an entrance that stays true: its engine list is the presets table, its links lead somewhere."""
from __future__ import annotations

import re
from pathlib import Path

from itertrace.queries import presets

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def test_the_engine_list_is_made_from_the_presets_table():
    text = README.read_text()
    assert presets.with_readme_block(text) == text, (
        "README.md's engine list differs from queries/presets.toml: run "
        "`.venv/bin/python -m itertrace.queries.presets README.md`")
    for preset in presets.presets():  # every row is listed, under its engine's name
        assert f"`preset={preset.name}`" in text
        assert f"**{presets.engine_labels()[preset.engine]}**" in text


def test_every_row_of_the_table_is_one_line_of_the_list():
    block = presets.markdown()
    assert sum(line.startswith("- `preset=") for line in block.splitlines()) == len(presets.presets())
    assert block.index("**vLLM**") < block.index("`preset=vllm`") < block.index("**SGLang**")


def test_every_relative_link_of_the_readme_and_docs_exists():
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which is missing"


def test_the_readme_is_an_entrance():
    text = README.read_text()
    assert len(text.splitlines()) <= 130
    assert "./scripts/demo" in text and "./scripts/test" in text
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec ./scripts/test")
