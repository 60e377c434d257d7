"""`autotune validate` and `autotune export`: the commands that read a written profile
without measuring it."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import engine_help, json_option, output_format
from autotune.output import Format, format_option, render


@user_errors
def validate(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    fmt: Format = format_option(),
    json_out: bool = json_option(),
):
    """Check a profile's shape against the schema, and its meaning against its own model
    block (layer indices within the model, trees within the heads, the recommended method
    present, positive sizes); name each wrong field and what it should be."""
    from autotune.commands.profiles import problems_in

    fmt = output_format(fmt, json_out)
    problems = problems_in(profile_path)
    if fmt is not Format.table:
        data = {"profile": str(profile_path), "valid": not problems, "problems": problems}
        typer.echo(render(data, fmt))
    else:
        for problem in problems:  # one line per wrong field
            typer.echo(f"error: {profile_path}: {problem}", err=True)
    if problems:
        raise typer.Exit(2)
    if fmt is Format.table:
        typer.echo(f"{profile_path}: valid")


@user_errors
def export(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    engine: str = typer.Option(
        ..., "--engine", metavar="ENGINE", help=engine_help("The engine to export to")
    ),
    method: str | None = typer.Option(
        None, help="The method to export (default: the profile's recommended method)."
    ),
    out: Path | None = typer.Option(None, help="Write to this file instead of stdout."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Export a method the profile does not recommend, or one that "
        "was not clearly faster than plain greedy decoding.",
    ),
):
    """Write a profile's recommended settings in a serving engine's own format. What the
    engine cannot express is printed as a warning and kept as a comment in the output."""
    from autotune.commands.profiles import export_of, serve_line, write_export

    result = export_of(profile_path, engine, method, force, out)
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", fg="yellow", err=True)
    if out is None:
        typer.echo(result.text, nl=False)
        if result.companion is not None:
            typer.secho(
                f"warning: these flags point to {result.companion.name}, a second file "
                f"(its content is in the comments above): pass --out to write both",
                fg="yellow",
                err=True,
            )
        return
    written = write_export(result, out)
    also = "".join(f" and {path}" for path in written[1:])
    typer.echo(
        f"wrote {out}{also} ({result.engine}, {result.method}; targets {result.engine_version})"
    )
    serve = serve_line(profile_path, result, out)
    if serve is not None:
        typer.echo(f"serve: {serve}")
