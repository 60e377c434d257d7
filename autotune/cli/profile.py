"""`autotune profile`: tune the methods on a model and write its decoding profile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotune import plan
from autotune.cli.errors import user_errors
from autotune.cli.options import (
    DEVICE_HELP,
    DTYPE_HELP,
    MODEL_HELP,
    MODEL_PATH_HELP,
    PROMPTS_HELP,
    STORAGE_HELP,
    method_pairs,
)
from autotune.schedule import parse_duration
from autotune.studies.workers import Workers

if TYPE_CHECKING:
    from autotune.profile.schema import ProfileBase


@user_errors
def profile(
    model: str = typer.Option("smollm2-135m", help=MODEL_HELP),
    model_path: str | None = typer.Option(None, help=MODEL_PATH_HELP),
    methods: str | None = typer.Option(
        None,
        help="Comma-separated methods to tune (default: every one that applies; "
        "`autotune methods` lists them).",
    ),
    prompts: str | None = typer.Option(None, help=PROMPTS_HELP),
    out: Path | None = typer.Option(None, help="Profile path (default profiles/<model>.yaml)."),
    storage: str | None = typer.Option(None, help=STORAGE_HELP),
    trials: int | None = typer.Option(None, min=1, help="Trials of each method's main study."),
    budget: str = typer.Option(
        f"{plan.BUDGET_S / 60:.0f}m",
        help="Time for the whole run (18m, 1h, 900s): head training, searches, selection "
        "and the held-back measurement share it, as the printed plan shows.",
    ),
    time_budget: float | None = typer.Option(
        None,
        min=1,
        help="Seconds for each method's searches, in place of its share of --budget.",
    ),
    train_heads: bool = typer.Option(
        True,
        help="Train the heads a method needs when none are given or found (autotune's "
        "heads cache, then the Hugging Face cache); --no-train-heads skips those methods.",
    ),
    heads: list[str] | None = typer.Option(
        None,
        "--heads",
        metavar="METHOD=DIR",
        help="Head folder a method drafts with, e.g. medusa=DIR or eagle=DIR (repeatable).",
    ),
    search_space: list[str] | None = typer.Option(
        None,
        "--search-space",
        metavar="METHOD=FILE",
        help="Search-space YAML laid over a method's default (repeatable; `autotune "
        "search-space METHOD` prints the default).",
    ),
    heldback_prompts: int = typer.Option(
        16, min=1, help="Held-back prompts each method is measured on."
    ),
    max_new_tokens: int = typer.Option(128, min=2, help="Tokens per held-back prompt."),
    ray_address: str | None = typer.Option(
        None,
        help="Join the Ray cluster at HOST:PORT (default: $RAY_ADDRESS, else the cluster "
        "`ray start` left running here, else a local Ray instance sized to this machine).",
    ),
    workers: int = typer.Option(
        1,
        min=1,
        help="Trials at once; each worker loads the target once and keeps it between trials.",
    ),
    cpus_per_trial: float | None = typer.Option(
        None,
        min=0.1,
        help="Cores each trial reserves (default: a timed CPU trial takes a whole machine, a "
        "proxy trial an equal share).",
    ),
    gpus_per_trial: float = typer.Option(
        0.0,
        min=0.0,
        help="GPUs each trial reserves (timed trials then run side by side, one per GPU).",
    ),
    threads: int | None = typer.Option(
        None, min=1, help="Torch threads (default: the cores this process may use)."
    ),
    margin: float = typer.Option(
        0.0,
        min=0.0,
        help="Recommend a method only when its held-back interval's low end clears 1 + MARGIN.",
    ),
    select_prompts: int = typer.Option(
        plan.SELECT_PROMPTS,
        min=1,
        help="Most search prompts the methods' candidates race on, side by side, to rank them.",
    ),
    engine: list[str] | None = typer.Option(
        None,
        "--engine",
        metavar="ENGINE",
        help="The serving engine you deploy to (repeatable: vllm, sglang, trtllm, hf, "
        "llamacpp, dv): only methods it serves are tuned, each within what it can express "
        "(n-gram drafts by its own matching rule). Default: every method, and every "
        "engine's own n-gram setting beside the profile's.",
    ),
    concurrency: str = typer.Option(
        "1,2,4,8",
        metavar="LEVELS",
        help="After the verdict, the recommended method with this many requests in flight "
        "(comma-separated), level by level as the budget allows: each level's setting "
        "(shorter drafts, or off) and throughput speedup go in the profile's load block. "
        "none: skip.",
    ),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
):
    """Tune the methods on this model and device; write a YAML decoding profile."""
    from autotune.commands.profile import profile_checked
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
        time_budget_s=time_budget,
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
    _print_verdict(*profile_checked(request))


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
