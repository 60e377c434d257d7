"""The README is a front door and the docs hold together: the README stays short and
starts with the two commands, every relative link in it and in docs/ reaches a file, and
docs/cli.md is what the CLI itself says (scripts/cli_reference.py), and the tables of
measured figures are what benchmarks/results.yaml records (benchmarks/tables.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MOST_README_LINES = 200
COMMAND_1 = "bash scripts/setup.sh && .venv/bin/autotune profile --model smollm2-135m"
COMMAND_2 = "bash scripts/setup.sh --dev && .venv/bin/python -m pytest -q"
# [text](target) and ![alt](target); the target ends at whitespace or the closing bracket
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
EXTERNAL = ("http://", "https://", "mailto:")


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def first_code_block(text: str) -> str:
    match = re.search(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert match, "README.md has no code block"
    return match.group(1)


def relative_links(path: Path) -> list[str]:
    """The links of a Markdown file that point into the repository, anchors cut off;
    links inside code blocks are code, not links."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    targets = (m.group(1).split("#")[0] for m in LINK.finditer(text))
    return [t for t in targets if t and not t.startswith(EXTERNAL)]


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MOST_README_LINES, f"README.md has {len(lines)} lines"


def test_readme_starts_with_the_two_commands():
    commands = [
        line.strip()
        for line in first_code_block(README.read_text()).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands == [COMMAND_1, COMMAND_2]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_files(path):
    missing = [t for t in relative_links(path) if not (path.parent / t).exists()]
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def test_the_link_check_sees_links():
    assert "docs/cli.md" in relative_links(README)


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_the_cli():
    wanted = load_script(ROOT / "scripts" / "cli_reference.py").reference()
    assert (DOCS / "cli.md").read_text() == wanted, (
        "docs/cli.md is stale: run .venv/bin/python scripts/cli_reference.py"
    )


def test_figure_tables_are_written_from_the_record():
    tables = load_script(ROOT / "benchmarks" / "tables.py")
    record = tables.load()
    for document in tables.DOCUMENTS:
        text = document.read_text()
        assert text == tables.rewritten(text, record), (
            f"{document.relative_to(ROOT)} has stale tables: run "
            ".venv/bin/python benchmarks/tables.py"
        )
    # the README's table of where it stands comes from the record too
    assert "<!-- results: standing -->" in README.read_text()


def test_a_recorded_row_reaches_the_table(tmp_path):
    tables = load_script(ROOT / "benchmarks" / "tables.py")
    table = {"columns": ["date", "figure"], "rows": [{"date": "2026-11-26", "figure": "1.5x"}]}
    text = "before\n<!-- results: t -->\nold\n<!-- /results -->\nafter\n"
    new = tables.rewritten(text, {"t": table})
    assert new == (
        "before\n<!-- results: t -->\n| date | figure |\n|---|---|\n"
        "| 2026-11-26 | 1.5x |\n<!-- /results -->\nafter\n"
    )
    with pytest.raises(ValueError, match="columns the table lacks"):
        tables.render({"columns": ["date"], "rows": [{"speed": "1x"}]})
