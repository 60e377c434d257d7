"""`autotune engines build`: a serving engine built from source into autotune's cache."""

from __future__ import annotations

import typer

from autotune.cli.errors import user_errors
from autotune.errors import AutotuneError


@user_errors
def build(
    engine: str = typer.Argument(..., metavar="ENGINE", help="llamacpp"),
    jobs: int | None = typer.Option(None, min=1, help="Compile jobs (default: every core)."),
):
    """Build a serving engine from its pinned source package into autotune's cache
    (llamacpp: llama.cpp's llama-server, about 5 minutes on 2 cores)."""
    from autotune.serving import llamacpp

    if engine.strip().lower() != "llamacpp":
        raise AutotuneError(f"unknown engine '{engine}': autotune builds llamacpp only")
    done = llamacpp.build(jobs, log=lambda line: typer.echo(line, err=True))
    typer.echo(done.line())
