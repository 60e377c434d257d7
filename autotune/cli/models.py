"""`autotune models list`: the model aliases autotune knows."""

from __future__ import annotations

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import json_option, output_format
from autotune.output import Format, format_option, render


@user_errors
def models_list(fmt: Format = format_option(), json_out: bool = json_option()):
    """Aliases and whether their weights are on this machine."""
    from autotune.models import list_models

    rows = list_models()
    fmt = output_format(fmt, json_out)
    if fmt is not Format.table:
        data = [
            {
                "alias": alias,
                "source": source,
                "found": status.startswith("found"),
                "path": status.removeprefix("found at ") if status.startswith("found") else None,
                "status": status,
            }
            for alias, source, status in rows
        ]
        typer.echo(render(data, fmt))
        return
    for alias, source, status in rows:
        typer.echo(f"{alias:14} {source:40} {status}")
