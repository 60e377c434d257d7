"""`autotune profile`: tune the methods on a model and write its decoding profile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from autotune import plan
from autotune.budget import command_started
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


def in_panel(panel: str, default: Any, metavar: str | None, help: str, *names: str, **more: Any):
    """An option shown in ``panel`` of --help."""
    return typer.Option(default, *names, metavar=metavar, help=help, rich_help_panel=panel, **more)


def search_option(default: Any, metavar: str, help: str, **limits: Any) -> Any:
    return in_panel(SEARCH_PANEL, default, metavar, help, **limits)


def workers_option(default: Any, metavar: str, help: str, **limits: Any) -> Any:
    return in_panel(WORKERS_PANEL, default, metavar, help, **limits)


@user_errors
def profile(
    model: str = typer.Option(
        "smollm2-135m",
        "--model",
        metavar="MODEL",
        help="Alias, repo id, model folder or .gguf file.",
    ),
    prompts: str | None = typer.Option(None, "--prompts", metavar="FILE", help=PROMPTS_HELP),
    out: Path | None = typer.Option(
        None, "--out", metavar="FILE", help="Profile path (default profiles/<model>.yaml)."
    ),
    budget: str = typer.Option(
        f"{plan.BUDGET_S / 60:.0f}m",
        "--budget",
        metavar="DURATION",
        help="Run time: 18m, 1h, 900s.",
    ),
    methods: str | None = typer.Option(
        None, "--methods", metavar="LIST", help="Comma-separated (default: all that apply)."
    ),
    engine: list[str] | None = typer.Option(
        None,
        "--engine",
        metavar="ENGINE",
        help=engine_help("Tune for the engine you deploy to (repeatable)"),
    ),
    device: str = device_option(),
    model_path: str | None = in_panel(MODEL_PANEL, None, "DIR", MODEL_PATH_HELP),
    dtype: str = dtype_option(rich_help_panel=MODEL_PANEL),
    threads: int | None = in_panel(
        MODEL_PANEL, None, "N", "Torch threads (default: all it may use).", min=1
    ),
    heads: list[str] | None = in_panel(
        HEADS_PANEL,
        None,
        "METHOD=DIR",
        "A method's heads, e.g. medusa=DIR (repeatable).",
        "--heads",
    ),
    train_heads: bool = in_panel(
        HEADS_PANEL, True, None, "Train missing heads, or skip their methods.", show_default=False
    ),
    search_space: list[str] | None = in_panel(
        MODEL_PANEL, None, "METHOD=FILE", "Search space YAML (repeatable).", "--search-space"
    ),
    trials: int | None = search_option(None, "N", "Trials of a method's main study.", min=1),
    time_budget: str | None = search_option(None, "DURATION", "Each method's search time."),
    select_prompts: int = search_option(plan.SELECT_PROMPTS, "N", "Most prompts raced on.", min=1),
    heldback_prompts: int = search_option(plan.HELDBACK_PROMPTS, "N", "Held-back prompts.", min=1),
    max_new_tokens: int = search_option(
        plan.HELDBACK_TOKENS, "N", "Tokens per held-back prompt.", min=2
    ),
    margin: float = search_option(
        plan.MARGIN, "X", "Recommend if its interval clears 1 + X.", min=0.0
    ),
    concurrency: str = search_option("1,2,4,8", "LEVELS", "Load levels to schedule (none: skip)."),
    workers: int = workers_option(1, "N", "Trials at once.", min=1),
    cpus_per_trial: float | None = workers_option(
        None, "X", "Cores a trial reserves (default: all for a timed CPU trial).", min=0.1
    ),
    gpus_per_trial: float | None = workers_option(
        None, "X", "GPUs a trial reserves (default: 1 where the model runs on a GPU).", min=0.0
    ),
    ray_address: str | None = workers_option(
        None, "HOST:PORT", "Ray cluster (default: $RAY_ADDRESS, `ray start`'s, else a local one)."
    ),
    storage: str | None = workers_option(
        None, "URL", "Study database (default: $AUTOTUNE_STORAGE, else studies/autotune.db)."
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
        started=command_started(),
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
