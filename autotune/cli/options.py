"""What several commands share: help texts, and helpers for the options they read and
the tables they print."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import typer

from autotune.errors import AutotuneError
from autotune.export.engines import ENGINES
from autotune.methods import registry
from autotune.output import Format, render
from autotune.schedule import parse_duration

if TYPE_CHECKING:
    from rich.console import Console


def choices(names: Iterable[str]) -> str:
    """An option's accepted values, as its help lists them: ``a, b or c``. Such options
    stay free text, checked in the command, so that a wrong value is one line naming the
    choices, as every bad input is (not click's usage screen)."""
    *rest, last = names
    return f"{', '.join(rest)} or {last}" if rest else last


# hardware.DTYPES with auto before them: hardware imports torch, which --help must not
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda", "cuda:N")

MODEL_HELP = "Alias, Hugging Face repo id (from the local cache), model folder or .gguf file."
MODEL_PATH_HELP = "Where the weights of the alias are."
PROMPTS_HELP = "JSONL calibration prompts (default: MT-bench)."
DURATION_HELP = "e.g. 18m, 1h, 900s; a bare number is seconds"
THREADS_HELP = "Torch threads (default: all cores)."
STORAGE_HELP = (
    "Study database SQLAlchemy URL (default $AUTOTUNE_STORAGE or sqlite:///studies/autotune.db)."
)
ROUNDS_HELP = "With --concurrency: rounds of prompts a level."


def engine_help(what: str) -> str:
    """``--engine``'s help: ``what`` it is for, then the engines autotune exports to."""
    return f"{what}: {choices(ENGINES)}."


def device_option(auto: str = "a GPU if any", rich_help_panel: str | None = None) -> Any:
    """``--device``: free text, as cuda:N is no fixed choice; checked when resolved."""
    return typer.Option(
        "auto",
        "--device",
        metavar="DEVICE",
        help=f"{choices(DEVICES)} (auto: {auto}).",
        rich_help_panel=rich_help_panel,
    )


def dtype_option(
    auto: str = "float32 on the CPU, else half", rich_help_panel: str | None = None
) -> Any:
    """``--dtype``: free text, as torch's spellings (fp16, torch.float16) are accepted too;
    checked when resolved."""
    return typer.Option(
        "auto",
        "--dtype",
        metavar="DTYPE",
        help=f"{choices(DTYPES)} (auto: {auto}).",
        rich_help_panel=rich_help_panel,
    )


def concurrency_option(help: str) -> Any:
    """``--concurrency``: load levels, comma-separated; parsed where they are used."""
    return typer.Option(None, "--concurrency", metavar="LEVELS", help=help)


def rounds_option() -> Any:
    """``--rounds``: with ``--concurrency``, rounds of prompts a level."""
    return typer.Option(6, min=2, help=ROUNDS_HELP)


def json_option(what: str = "") -> Any:
    """``--json``: kept for scripts written before ``-f``, as ``-f json``."""
    return typer.Option(False, "--json", help=f"The same as -f json{what}.")


def output_format(fmt: Format, json_out: bool) -> Format:
    return Format.json if json_out else fmt


def echo_data(data: Any, fmt: Format, lines_of: Callable[[Any], Iterable[str]]) -> None:
    """``data`` in the format asked for; as a table, the lines ``lines_of`` makes of it."""
    if fmt is not Format.table:
        typer.echo(render(data, fmt))
        return
    for line in lines_of(data):
        typer.echo(line)


def set_torch_threads(threads: int | None) -> int:
    """Torch's thread count, set deliberately (recorded in the profile)."""
    from autotune.measure.noise import set_threads

    return set_threads(threads)


def method_pairs(values: list[str] | None, option: str) -> dict[str, str]:
    """``METHOD=VALUE`` options as {method: value}."""
    out = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise AutotuneError(
                f"{option} {value!r}: write it as METHOD=VALUE, e.g. "
                f"{option} medusa=heads/smollm2-135m-medusa"
            )
        out[registry.get(name).name] = rest.strip()
    return out


def console() -> Console:
    """Rich output, wide when not on a terminal, so that piped study names are never cut."""
    from rich.console import Console

    wide = Console()
    return wide if wide.is_terminal else Console(width=200)


def duration(text: str | None, option: str) -> float | None:
    """An optional duration option in seconds (``autotune.schedule.parse_duration``)."""
    return parse_duration(text, option) if text is not None else None
