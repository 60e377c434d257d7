"""`autotune methods` and `autotune search-space`: what the method registry holds."""

from __future__ import annotations

from typing import Any

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import echo_data, json_option, output_format
from autotune.errors import AutotuneError
from autotune.methods import registry
from autotune.output import Format, format_option


@user_errors
def list_methods(fmt: Format = format_option(), json_out: bool = json_option()):
    """The speculative methods autotune tunes, and the engines each exports to."""
    echo_data(method_rows(), output_format(fmt, json_out), method_lines)


def method_rows() -> list[dict]:
    """Each registry entry: a drafting method with the heads it needs and the engines it
    exports to, or an expansion with the methods it widens."""
    from autotune.methods.base import Method

    rows: list[dict] = []
    for name, entry in registry.entries().items():
        row: dict[str, Any] = {"name": name, "title": entry.title, "summary": entry.summary}
        if isinstance(entry, Method):
            row |= {"kind": "method", "heads": entry.heads, "exports": list(entry.exporters)}
        else:
            widens = [n for n, m in registry.methods().items() if m.chain]
            row |= {"kind": "expansion", "widens": widens}
        rows.append(row)
    return rows


def method_lines(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        start = f"{row['name']:10} {row['title']}: {row['summary']}"
        if row["kind"] == "expansion":
            lines.append(f"{start}; widens: {', '.join(row['widens'])}")
            continue
        needs = f"; needs {row['heads']} heads" if row["heads"] else ""
        lines.append(f"{start}{needs}; exports: {', '.join(row['exports']) or '-'}")
    return lines


@user_errors
def search_space(method: str = typer.Argument(..., metavar="METHOD")):
    """Print a method's default search space (YAML): copy it, edit it, pass it back with
    `profile --search-space METHOD=FILE`."""
    from autotune.methods.base import packaged_space_text

    entry = registry.get(method)
    if entry.space_model is None:
        raise AutotuneError(f"{entry.name} has no search space")
    typer.echo(packaged_space_text(entry), nl=False)
