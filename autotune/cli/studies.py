"""`autotune studies ...`: the study database, read, plotted, pruned and browsed."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import STORAGE_HELP, console, json_option, output_format
from autotune.commands import interrupt
from autotune.output import Format, format_option, render
from autotune.studies.dashboard import dashboard_server, require_dashboard


@user_errors
def studies_list(
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    fmt: Format = format_option(),
    json_out: bool = json_option(),
):
    """Every study: model, method, trials, best value and measured speedup, last update."""
    from autotune.studies.inspect import StudyDatabase, studies_table

    db = StudyDatabase(storage)
    summaries = db.summaries()
    fmt = output_format(fmt, json_out)
    if fmt is not Format.table:
        data = {"storage": db.where, "studies": [s.as_dict() for s in summaries]}
        typer.echo(render(data, fmt))
        return
    if not summaries:
        typer.echo(f"no studies in {db.where}")
        return
    typer.echo(f"studies in {db.where}")
    console().print(studies_table(summaries))


@user_errors
def show(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    profiles: Path = typer.Option(
        Path("profiles"), help="Folder of profiles to search for the one this study fed."
    ),
    fmt: Format = format_option(),
    json_out: bool = json_option(),
):
    """A study's best parameters and measured figures, its attributes, and the profile it fed."""
    from autotune.studies.inspect import StudyDatabase, profiles_naming, show_data, show_lines

    fmt = output_format(fmt, json_out)
    db = StudyDatabase(storage)
    summary = db.summary(name)
    uses = list(profiles_naming(summary, profiles))
    if fmt is not Format.table:
        typer.echo(render(show_data(summary, uses, db.where), fmt))
        return
    for line in show_lines(summary, uses, profiles, db.where):
        typer.echo(line)


@user_errors
def trials(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    top: int | None = typer.Option(None, min=1, help="Only the N best trials."),
    json_out: bool = json_option(": every parameter and measured figure"),
    fmt: Format = format_option(),
):
    """A study's trials, best first: number, state, value, parameters, fail reason, duration."""
    from autotune.studies.inspect import (
        StudyDatabase,
        constant_params_note,
        trials_heading,
        trials_table,
    )

    summary = StudyDatabase(storage).summary(name)
    rows = summary.trials[:top] if top else summary.trials
    fmt = output_format(fmt, json_out)
    if fmt is not Format.table:
        data = {
            "study": summary.name,
            "direction": summary.direction,
            "objective": summary.user_attrs.get("objective"),
            "trials": [row.as_dict() for row in rows],
        }
        typer.echo(render(data, fmt))
        return
    typer.echo(trials_heading(summary, rows))
    console().print(trials_table(rows))
    note = constant_params_note(rows)
    if note:
        typer.echo(note)


@user_errors
def plot(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    out: Path = typer.Option(Path("studies/plots"), help="Folder for the PNG files."),
):
    """Optimisation history and parameter importance of a study, as PNG files."""
    from autotune.studies.inspect import StudyDatabase, plot_study

    result = plot_study(StudyDatabase(storage).load(name), out)
    for reason in result.skipped:
        typer.secho(f"note: {reason}", fg="yellow", err=True)
    for path in result.written:
        typer.echo(f"wrote {path}")


@user_errors
def delete(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
):
    """Delete one study and its trials (nothing else: measurements and profiles stay)."""
    from autotune.studies.inspect import StudyDatabase

    db = StudyDatabase(storage)
    count = len(db.summary(name).trials)
    if not yes and not typer.confirm(
        f"delete study {name} and its {count} trials from {db.where}?", default=False
    ):
        typer.echo("not deleted", err=True)
        raise typer.Exit(1)
    interrupt.tell("nothing was deleted (a study is deleted in one transaction)")
    db.delete(name)
    typer.echo(f"deleted study {name} ({count} trials)")


@user_errors
def dashboard(
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    host: str = typer.Option(
        "127.0.0.1", help="Address to listen on (0.0.0.0: reachable from other machines)."
    ),
    port: int = typer.Option(8080, min=0, max=65535, help="Port (0: any free one)."),
):
    """Browse the study database in optuna-dashboard (an optional extra: pip install
    'autotune[dashboard]'); it follows running studies live. Ctrl-C stops it."""
    from autotune.studies.inspect import StudyDatabase

    require_dashboard()  # a missing extra is said before anything else
    db = StudyDatabase(storage)
    server = dashboard_server(db.storage, host, port)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"optuna-dashboard of {db.where} at http://{shown}:{server.server_port}/")
    typer.echo("Ctrl-C stops it", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass  # the way to stop it: not an interruption of work
    finally:
        server.server_close()
