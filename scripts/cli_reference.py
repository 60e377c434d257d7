"""Writes docs/cli.md, the CLI reference, from the CLI itself: the --help text of every
command and group of ``autotune``, at 80 columns, so that the reference cannot drift from
the options. Run it after changing a command's options or help texts.

    .venv/bin/python scripts/cli_reference.py           # writes docs/cli.md
    .venv/bin/python scripts/cli_reference.py --check   # exit 1 when docs/cli.md is stale

tests/test_docs.py calls ``reference()`` and compares it with the file.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import typer.rich_utils

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "cli.md"
PROGRAM = "autotune"
COLUMNS = 80
# what a terminal might add although the help goes to a string: colour and style codes
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

HEADER = f"""# CLI reference

[Back to the README](../README.md)

Every command's `--help`, at {COLUMNS} columns. This file is generated from the CLI itself
by `scripts/cli_reference.py`: do not edit it by hand; after changing a command, run
`.venv/bin/python scripts/cli_reference.py` (`tests/test_docs.py` fails while it is stale).
"""


@contextlib.contextmanager
def help_width(columns: int) -> Iterator[None]:
    """Help rendered ``columns`` wide whatever the terminal: rich reads $COLUMNS, and
    typer's $TERMINAL_WIDTH (read once, into MAX_WIDTH) would override it."""
    saved_env, saved_max = os.environ.get("COLUMNS"), typer.rich_utils.MAX_WIDTH
    os.environ["COLUMNS"] = str(columns)
    typer.rich_utils.MAX_WIDTH = columns
    try:
        yield
    finally:
        typer.rich_utils.MAX_WIDTH = saved_max
        if saved_env is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved_env


# Typer builds its commands on a click of its own (typer._click in recent releases), so
# commands and contexts are handled by what they do, not by click's classes.
Command = Any
Context = Any


def context(command: Command, name: str, parent: Context | None = None) -> Context:
    """A context for ``command`` invoked as ``name`` (under ``parent``), of the context
    class the command itself uses."""
    return command.context_class(command, info_name=name, parent=parent)


def help_text(command: Command, ctx: Context) -> str:
    """``command``'s --help as plain text. Typer's rich help prints to standard output
    rather than returning its text, so it is captured there."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        returned = command.get_help(ctx)
    text = ANSI_CODE.sub("", captured.getvalue() + returned)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def walk(command: Command, ctx: Context) -> Iterator[tuple[str, str]]:
    """(command path, help text) of ``command`` and, for a group, of every command below
    it, in the order --help lists them."""
    yield ctx.command_path, help_text(command, ctx)
    if not hasattr(command, "list_commands"):  # a command, not a group
        return
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield from walk(sub, context(sub, name, ctx))


def reference() -> str:
    """The text of docs/cli.md."""
    from autotune.cli import app

    root = typer.main.get_command(app)
    sections = [HEADER]
    with help_width(COLUMNS):
        for path, text in walk(root, context(root, PROGRAM)):
            sections.append(f"## `{path}`\n\n```text\n{text}\n```\n")
    return "\n".join(sections)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Write docs/cli.md from the CLI itself.")
    parser.add_argument(
        "--check", action="store_true", help="only say whether docs/cli.md is current"
    )
    check = parser.parse_args(argv).check
    wanted = reference()
    current = OUTPUT.read_text() if OUTPUT.exists() else None
    if check:
        if current == wanted:
            return 0
        print(f"{OUTPUT.relative_to(ROOT)} is stale: run python scripts/cli_reference.py")
        return 1
    OUTPUT.write_text(wanted)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
