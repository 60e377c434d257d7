"""The measured figures' tables, regenerated from one record.

``benchmarks/results.yaml`` holds every figure the documentation quotes, one row per
measurement, each table with its columns. A table appears in a Markdown file between

    <!-- results: TABLE -->
    ... (written by this script)
    <!-- /results -->

and this script rewrites what lies between from the record, so a figure is edited in one
place (or appended by a benchmark script's ``--record``) and the README's table and
docs/benchmarks.md cannot disagree with it or with each other.

    .venv/bin/python benchmarks/tables.py          # rewrite the tables in the docs
    .venv/bin/python benchmarks/tables.py --check  # exit 1 if a table is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.yaml"
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")
BLOCK = re.compile(r"(<!-- results: ([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.DOTALL)
HEADER = """\
# Every measured figure the README and docs/benchmarks.md quote, one row per measurement.
# Edit here (or let a benchmark's --record append a row), then run
# `.venv/bin/python benchmarks/tables.py` to rewrite the tables in the docs.
"""


def load(path: Path = RESULTS) -> dict[str, dict]:
    return yaml.safe_load(path.read_text())["tables"]


def render(table: dict) -> str:
    """A table as Markdown: its columns, then each row's cells in their order (a missing
    cell is empty)."""
    columns = table["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table["rows"]:
        unknown = set(row) - set(columns)
        if unknown:
            raise ValueError(f"a row names columns the table lacks: {sorted(unknown)}")
        cells = [str(row.get(column, "")).replace("\n", " ") for column in columns]
        lines.append("| " + " | ".join(cells) + " |")
    # an empty cell is written "| |", as a person writes it
    return "\n".join(line.replace("|  |", "| |") for line in lines) + "\n"


def rewritten(text: str, tables: dict[str, dict]) -> str:
    """``text`` with each marked table written from ``tables``."""

    def table(match: re.Match) -> str:
        name = match.group(2)
        if name not in tables:
            raise KeyError(f"no table '{name}' in {RESULTS.name}")
        return match.group(1) + render(tables[name]) + match.group(4)

    return BLOCK.sub(table, text)


def record(name: str, row: dict, path: Path = RESULTS) -> None:
    """Append ``row`` to the table ``name`` and rewrite the docs' tables."""
    tables = load(path)
    tables[name]["rows"].append(row)
    body = yaml.safe_dump({"tables": tables}, sort_keys=False, allow_unicode=True, width=100)
    path.write_text(HEADER + body)
    for document in DOCUMENTS:
        document.write_text(rewritten(document.read_text(), tables))


def main(argv: list[str]) -> int:
    tables = load()
    stale = []
    for document in DOCUMENTS:
        text = document.read_text()
        new = rewritten(text, tables)
        if new != text:
            stale.append(document.relative_to(ROOT))
            if "--check" not in argv:
                document.write_text(new)
    if "--check" in argv and stale:
        names = ", ".join(map(str, stale))
        print(f"stale tables in {names}: run .venv/bin/python benchmarks/tables.py")
        return 1
    print("rewrote " + ", ".join(map(str, stale)) if stale else "tables up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
