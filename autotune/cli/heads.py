"""`autotune heads train`: drafting heads trained for a target model."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import (
    DURATION_HELP,
    MODEL_HELP,
    MODEL_PATH_HELP,
    PROMPTS_HELP,
    THREADS_HELP,
    choices,
    device_option,
    dtype_option,
    duration,
)
from autotune.training import kinds
from autotune.training.report import accuracy_table


@user_errors
def train(
    kind: str = typer.Option(
        ...,
        "--kind",
        metavar="KIND",
        help=f"Head kind: {choices(kinds.KINDS)} (Medusa-1 heads, an EAGLE-1/2 one-layer "
        "draft head, a GLIDE small-decoder draft).",
    ),
    model: str = typer.Option("smollm2-135m", help=MODEL_HELP),
    model_path: str | None = typer.Option(None, help=MODEL_PATH_HELP),
    out: Path | None = typer.Option(
        None,
        help="Heads folder (default: autotune's heads cache, where `profile` finds them).",
    ),
    num_heads: int | None = typer.Option(
        None, min=1, help="Medusa only: heads; head k predicts k+2 tokens ahead (default 5)."
    ),
    prompts: str | None = typer.Option(None, help=PROMPTS_HELP),
    max_new_tokens: int | None = typer.Option(
        None, min=2, help="Length of the target's answers to train on (default 256)."
    ),
    epochs: int | None = typer.Option(
        None, min=1, help="Passes over the answers (default: medusa 6, eagle 40)."
    ),
    time_budget: str | None = typer.Option(
        None,
        "--time-budget",
        metavar="DURATION",
        help=f"Time for generation and training together ({DURATION_HELP}; default: "
        "medusa 780s, eagle 870s, glide 600s): training ends early to keep it; the "
        "held-back report comes after.",
    ),
    threads: int | None = typer.Option(None, min=1, help=THREADS_HELP),
    device: str = device_option(),
    dtype: str = dtype_option(),
):
    """Train heads on the target's own greedy answers; report accuracy on held-back prompts
    (per head for Medusa; per draft depth for EAGLE, each depth drafting from the last)."""
    from rich.console import Console

    from autotune.commands.heads import train_heads_checked
    from autotune.training.job import HeadsJob

    given = {
        "num_heads": num_heads,
        "max_new_tokens": max_new_tokens,
        "epochs": epochs,
        "time_budget_s": duration(time_budget, "--time-budget"),
    }
    job = HeadsJob(
        kind=kind,
        model=model,
        model_path=model_path,
        prompts=prompts,
        out=out,
        options=kinds.kind(kind).options_with(given),
        dtype=dtype,
        device=device,
    )
    result, folder = train_heads_checked(job, threads)
    stats = result.stats
    Console().print(
        accuracy_table(
            result.accuracy, f"held-back accuracy ({result.held_back_tokens} answer tokens)"
        )
    )
    typer.echo(
        f"trained {stats.epochs:.2f} epochs ({stats.steps} steps"
        f"{', stopped by --time-budget' if stats.stopped_by_time else ''}) on "
        f"{result.train_tokens} answer tokens in {result.seconds['total']:.0f} s"
    )
    typer.echo(f"wrote {folder}")
