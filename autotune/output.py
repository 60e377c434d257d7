"""Output formats of the commands that print results (`-f/--format`): a table or lines
for people, JSON or YAML for programs. The JSON and YAML of one result hold the same
data. Imports nothing heavy: the CLI's --help stays instant."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any


class Format(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def format_option(default: Format = Format.table) -> Any:
    import typer

    return typer.Option(
        default,
        "--format",
        "-f",
        case_sensitive=False,
        help="Output: table (for people), json or yaml (for programs).",
    )


def render(data: Any, fmt: Format) -> str:
    """``data`` as JSON or YAML text (values JSON cannot hold, such as datetimes, as
    strings; the YAML holds what the JSON holds)."""
    text = json.dumps(data, indent=2, default=str)
    if fmt is Format.json:
        return text
    if fmt is Format.yaml:
        import yaml

        return yaml.safe_dump(json.loads(text), sort_keys=False, allow_unicode=True).rstrip()
    raise ValueError(f"{fmt} is not a data format")
