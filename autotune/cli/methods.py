"""`autotune methods` and `autotune search-space`: what the method registry holds."""

from __future__ import annotations

import typer

from autotune.cli.errors import user_errors
from autotune.errors import AutotuneError
from autotune.methods import registry


@user_errors
def list_methods():
    """The speculative methods autotune tunes, and the engines each exports to."""
    from autotune.methods.base import Method

    for name, entry in registry.entries().items():
        if isinstance(entry, Method):
            needs = f"; needs {entry.heads} heads" if entry.heads else ""
            engines = ", ".join(entry.exporters) or "-"
            typer.echo(f"{name:10} {entry.title}: {entry.summary}{needs}; exports: {engines}")
        else:
            chains = ", ".join(n for n, m in registry.methods().items() if m.chain)
            typer.echo(f"{name:10} {entry.title}: {entry.summary}; widens: {chains}")


@user_errors
def search_space(method: str = typer.Argument(..., metavar="METHOD")):
    """Print a method's default search space (YAML): copy it, edit it, pass it back with
    `profile --search-space METHOD=FILE`."""
    from autotune.methods.base import packaged_space_text

    entry = registry.get(method)
    if entry.space_model is None:
        raise AutotuneError(f"{entry.name} has no search space")
    typer.echo(packaged_space_text(entry), nl=False)
