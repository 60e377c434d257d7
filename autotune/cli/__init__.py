"""The command line, ``autotune``: its command tree. Each command lives in the module of
its kind; heavy libraries are imported inside commands so that --help is instant."""

from __future__ import annotations

import os

import typer

from autotune.cli import (
    engines,
    heads,
    latency,
    methods,
    models,
    profile,
    profiles,
    remeasure,
    studies,
)

__all__ = ["app"]

app = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Fit speculative-decoding settings to your model, hardware and workload.",
)


def _print_version(value: bool) -> None:
    if value:
        from autotune import __version__

        typer.echo(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Fit speculative-decoding settings to your model, hardware and workload."""
    # https://no-color.org: rich honours it by itself; click's coloured messages (secho)
    # take their colour setting from the context
    if os.environ.get("NO_COLOR"):
        ctx.color = False


# --help lists the commands in this order, then the groups in theirs
COMMANDS = {
    "profile": profile.profile,
    "methods": methods.list_methods,
    "search-space": methods.search_space,
    "bench": remeasure.bench,
    "validate": profiles.validate,
    "export": profiles.export,
    "verify": remeasure.verify,
    "latency": latency.latency,
}
GROUPS = {
    "models": ("Models autotune knows about.", {"list": models.models_list}),
    "engines": ("Serving engines autotune runs itself.", {"build": engines.build}),
    "heads": ("Train drafting heads for a target model.", {"train": heads.train}),
    "studies": (
        "The study database: list, show, trials, plot, delete, dashboard.",
        {
            "list": studies.studies_list,
            "show": studies.show,
            "trials": studies.trials,
            "plot": studies.plot,
            "delete": studies.delete,
            "dashboard": studies.dashboard,
        },
    ),
}


def _add_commands(root: typer.Typer) -> None:
    for name, command in COMMANDS.items():
        root.command(name)(command)
    for name, (summary, commands) in GROUPS.items():
        group = typer.Typer(no_args_is_help=True, help=summary)
        for command_name, command in commands.items():
            group.command(command_name)(command)
        root.add_typer(group, name=name)


_add_commands(app)
