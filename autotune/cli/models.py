"""`autotune models list`: the model aliases autotune knows."""

from __future__ import annotations

import typer

from autotune.cli.errors import user_errors
from autotune.output import Format, format_option, render


@user_errors
def models_list(fmt: Format = format_option()):
    """Aliases and whether their weights are on this machine."""
    from autotune.models import list_models

    rows = list_models()
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
