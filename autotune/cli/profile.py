"""`autotune profile`: tune the methods on a model and write its decoding profile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotune import plan
from autotune.cli.errors import user_errors
from autotune.cli.options import (
    MODEL_PATH_HELP,
    PROMPTS_HELP,
    device_option,
    dtype_option,
    duration,
    engine_help,
    method_pairs,
)
from autotune.schedule import parse_duration
from autotune.studies.workers import Workers

if TYPE_CHECKING:
    from autotune.profile.schema import ProfileBase


# --help's panels: the everyday options (no panel: click's own "Options") come first
MODEL_PANEL = "Model"
HEADS_PANEL = "Heads"
SEARCH_PANEL = "Search and measurement"
WORKERS_PANEL = "Workers and storage"


@user_errors
def profile(
    model: str = typer.Option(
        "smollm2-135m", metavar="MODEL", help="Alias, repo id, model folder or .gguf file."
    ),
    prompts: str | None = typer.Option(None, metavar="FILE", help=PROMPTS_HELP),
    out: Path | None = typer.Option(
        None, metavar="FILE", help="Profile path (default profiles/<model>.yaml)."
    ),
    budget: str = typer.Option(
        f"{plan.BUDGET_S / 60:.0f}m",
        metavar="DURATION",
        help="Run time: 18m, 1h, 900s.",
    ),
    methods: str | None = typer.Option(
        None, metavar="LIST", help="Comma-separated (default: all that apply)."
    ),
    engine: list[str] | None = typer.Option(
        None,
        "--engine",
        metavar="ENGINE",
        help=engine_help("Tune for the engine you deploy to (repeatable)"),
    ),
    device: str = device_option(),
    model_path: str | None = typer.Option(
        None, metavar="DIR", help=MODEL_PATH_HELP, rich_help_panel=MODEL_PANEL
    ),
    dtype: str = dtype_option(rich_help_panel=MODEL_PANEL),
    threads: int | None = typer.Option(
        None,
        min=1,
        metavar="N",
        help="Torch threads (default: all it may use).",
        rich_help_panel=MODEL_PANEL,
    ),
    heads: list[str] | None = typer.Option(
        None,
        "--heads",
        metavar="METHOD=DIR",
        help="A method's heads, e.g. medusa=DIR (repeatable).",
        rich_help_panel=HEADS_PANEL,
    ),
    train_heads: bool = typer.Option(
        True,
        help="Train missing heads, or skip their methods.",
        show_default=False,
        rich_help_panel=HEADS_PANEL,
    ),
    search_space: list[str] | None = typer.Option(
        None,
        "--search-space",
        metavar="METHOD=FILE",
        help="Search space YAML (repeatable).",
        rich_help_panel=MODEL_PANEL,
    ),
    trials: int | None = typer.Option(
        None,
        min=1,
        metavar="N",
        help="Trials of a method's main study.",
        rich_help_panel=SEARCH_PANEL,
    ),
    time_budget: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="Each method's search time.",
        rich_help_panel=SEARCH_PANEL,
    ),
    select_prompts: int = typer.Option(
        plan.SELECT_PROMPTS,
        min=1,
        metavar="N",
        help="Most prompts raced on.",
        rich_help_panel=SEARCH_PANEL,
    ),
    heldback_prompts: int = typer.Option(
        16,
        min=1,
        metavar="N",
        help="Held-back prompts.",
        rich_help_panel=SEARCH_PANEL,
    ),
    max_new_tokens: int = typer.Option(
        128, min=2, metavar="N", help="Tokens per held-back prompt.", rich_help_panel=SEARCH_PANEL
    ),
    margin: float = typer.Option(
        0.0,
        min=0.0,
        metavar="X",
        help="Recommend if its interval clears 1 + X.",
        rich_help_panel=SEARCH_PANEL,
    ),
    concurrency: str = typer.Option(
        "1,2,4,8",
        metavar="LEVELS",
        help="Load levels to schedule (none: skip).",
        rich_help_panel=SEARCH_PANEL,
    ),
    workers: int = typer.Option(
        1, min=1, metavar="N", help="Trials at once.", rich_help_panel=WORKERS_PANEL
    ),
    cpus_per_trial: float | None = typer.Option(
        None,
        min=0.1,
        metavar="X",
        help="Cores a trial reserves (default: all for a timed CPU trial).",
        rich_help_panel=WORKERS_PANEL,
    ),
    gpus_per_trial: float = typer.Option(
        0.0, min=0.0, metavar="X", help="GPUs a trial reserves.", rich_help_panel=WORKERS_PANEL
    ),
    ray_address: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="Ray cluster (default: $RAY_ADDRESS, `ray start`'s, else a local one).",
        rich_help_panel=WORKERS_PANEL,
    ),
    storage: str | None = typer.Option(
        None,
        metavar="URL",
        help="Study database (default: $AUTOTUNE_STORAGE, else studies/autotune.db).",
        rich_help_panel=WORKERS_PANEL,
    ),
):
    """Tune the methods on this model and device; write a YAML decoding profile."""
    from autotune.commands.profile import next_steps, profile_checked
    from autotune.export import check_engine
    from autotune.measure.load import parse_levels
    from autotune.profiling import ProfileRequest, parse_methods

    request = ProfileRequest(
        model=model,
        model_path=model_path,
        methods=parse_methods(methods) if methods is not None else None,
        prompts=prompts,
        out=out,
        storage=storage,
        trials=trials,
        time_budget_s=duration(time_budget, "--time-budget"),
        budget_s=parse_duration(budget),
        train_heads=train_heads,
        heads=method_pairs(heads, "--heads"),
        search_spaces=method_pairs(search_space, "--search-space"),
        heldback_prompts=heldback_prompts,
        max_new_tokens=max_new_tokens,
        select_prompts=select_prompts,
        margin=margin,
        workers=Workers(workers, cpus_per_trial, gpus_per_trial, ray_address),
        dtype=dtype,
        device=device,
        threads=threads,
        engines=tuple(dict.fromkeys(check_engine(e) for e in engine)) if engine else None,
        concurrency=parse_levels(concurrency),
    )
    result, path = profile_checked(request)
    _print_verdict(result, path)
    for line in next_steps(result, path, request.engines):
        typer.echo(line)


def _print_verdict(result: ProfileBase, path: Path) -> None:
    """The files written, the verdict's table and its lines."""
    from rich.console import Console

    from autotune.profile.report import plot_path, verdict_table
    from autotune.profiling import verdict_lines

    typer.echo(f"wrote {path}")
    plot = plot_path(path)
    if plot.exists():
        typer.echo(f"wrote {plot}")
    Console(width=120).print(verdict_table(result))
    for line in verdict_lines(result):
        typer.echo(line)
