"""`autotune bench` and `autotune verify`: a written profile measured again, in autotune
or in the serving engine its export is for."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import (
    DURATION_HELP,
    choices,
    concurrency_option,
    device_option,
    dtype_option,
    duration,
    echo_data,
    engine_help,
    json_option,
    output_format,
    rounds_option,
    set_torch_threads,
)
from autotune.commands import interrupt, study_kept
from autotune.errors import AutotuneError
from autotune.output import Format, format_option

# the engines verify runs itself (autotune.verify.ENGINES, which imports too much for
# --help to stay instant; a test keeps the two the same)
VERIFIED_ENGINES = ("llamacpp", "hf")


@user_errors
def bench(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    prompts: str | None = typer.Option(
        None, help="JSONL prompts (default: the profile's held-back split)."
    ),
    max_new_tokens: int = typer.Option(128, min=1),
    json_out: bool = json_option(": one object keyed by method"),
    fmt: Format = format_option(),
    model_path: str | None = typer.Option(None, help="Override where the model is."),
    threads: int | None = typer.Option(None, min=1),
    device: str = device_option(),
    dtype: str = dtype_option(auto="the profile's dtype"),
    concurrency: str | None = concurrency_option(
        "Measure the recommended method with this many requests in flight instead "
        "(comma-separated, e.g. 1,2,4,8): its scheduled and its tuned setting against "
        "plain decoding, throughput with intervals over rounds of prompts."
    ),
    rounds: int = rounds_option(),
    engine: str | None = typer.Option(
        None,
        "--engine",
        metavar="ENGINE",
        help=engine_help(
            "With --concurrency: measure the setting this engine's export serves (its own "
            "drafting rule), capped per level as the export caps it"
        ),
    ),
):
    """Re-measure a profile's methods against plain greedy decoding, independently."""
    from autotune.bench import bench_load, bench_profile
    from autotune.commands.inputs import Remeasure, check_remeasure
    from autotune.measure.load import parse_levels

    set_torch_threads(threads)
    fmt = output_format(fmt, json_out)
    if engine is not None and concurrency is None:
        raise AutotuneError("--engine goes with --concurrency: give the levels, e.g. 1,2,4,8")
    others = "pass --prompts FILE to measure on others"
    check_remeasure(profile_path, Remeasure(prompts, max_new_tokens, model_path, others))
    if concurrency is not None:
        levels = parse_levels(concurrency)
        if not levels:
            raise AutotuneError("--concurrency none: give the levels to measure, e.g. 1,2,4,8")
        load = bench_load(
            profile_path, levels, prompts, max_new_tokens, rounds, model_path, dtype, device, engine
        )
        echo_data(load, fmt, bench_load_lines)
        return
    results = bench_profile(profile_path, prompts, max_new_tokens, model_path, dtype, device)
    echo_data(results, fmt, bench_lines)


def bench_lines(results: dict) -> list[str]:
    """A line per method measured, and one per prompt category under it; then whether the
    profile's recommendation holds."""
    from autotune.measure.timing import interval_text

    lines = []
    for method, row in results.items():
        if not isinstance(row, dict):
            continue
        lines.append(
            f"{method}: {interval_text(row)} ({row['tokens_per_s']:.1f} vs "
            f"{row['baseline_tokens_per_s']:.1f} tokens/s), {row['tokens_per_step']:.2f} "
            f"tokens/step, lossless {row['lossless']}, {row['prompts']} prompts"
            + (f", in {row['measured_in']}" if row.get("measured_in") else "")
        )
        for category, part in (row.get("by_category") or {}).items():
            lines.append(f"  {category}: {interval_text(part)} ({part['prompts']} prompts)")
    holds = "holds" if results["recommended_holds"] else "does not hold here"
    return [*lines, f"the profile recommends {results['recommended']}: {holds}"]


def bench_load_lines(load: dict) -> list[str]:
    """A line per level: the scheduled and the tuned setting against plain decoding."""
    from autotune.measure.load import requests_text
    from autotune.measure.timing import interval_text

    lines = []
    for row in load["levels"]:
        parts = []
        for name in dict.fromkeys([row["scheduled"], "tuned"]):
            figure = row.get(name)
            if figure is None:
                parts.append(f"{name} (plain decoding)")
                continue
            parts.append(
                f"{name} {interval_text(figure)} ({figure['tokens_per_s']:.1f} vs "
                f"{figure['baseline_tokens_per_s']:.1f} tokens/s, lossless {figure['lossless']})"
            )
        whose = f" (the {load['engine']} export's setting)" if load.get("engine") else ""
        whose += f" in {load['measured_in']}" if load.get("measured_in") else ""
        lines.append(
            f"{load['method']}{whose} with {requests_text(row['concurrency'])} in flight, "
            f"{row['rounds']} rounds: " + "; ".join(parts)
        )
    return lines


@user_errors
def verify(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    engine: str = typer.Option(
        ...,
        "--engine",
        metavar="ENGINE",
        help=f"The engine to measure the export in: {choices(VERIFIED_ENGINES)}.",
    ),
    limit: int | None = typer.Option(
        None, min=1, help="At most this many held-back prompts (default: all of them)."
    ),
    max_new_tokens: int | None = typer.Option(
        None, min=1, help="Tokens a prompt decodes (default: the profile's)."
    ),
    gguf: Path | None = typer.Option(
        None, help="llama.cpp: the model as a GGUF file (default: the profile's, if a GGUF)."
    ),
    draft_gguf: Path | None = typer.Option(
        None, help="llama.cpp: the draft model an export that drafts with one needs."
    ),
    record: bool = typer.Option(
        True, "--record/--no-record", help="Write the figures into the profile (verified)."
    ),
    tune: str | None = typer.Option(
        None,
        "--tune",
        metavar="DURATION",
        help="llama.cpp, n-gram: first tune ngram-simple's options in llama-server itself on "
        f"the search prompts for at most this long ({DURATION_HELP}), and verify that "
        "setting; it becomes the profile's llama.cpp setting.",
    ),
    storage: str | None = typer.Option(
        None, help="Study database for --tune (default: as `autotune profile`)."
    ),
    json_out: bool = json_option(),
    fmt: Format = format_option(),
    concurrency: str | None = concurrency_option(
        "llama.cpp: instead, serve with as many slots as the highest level and measure "
        "the export against plain decoding with this many concurrent requests "
        "(comma-separated, e.g. 1,2,4,8); recorded under the profile's load block."
    ),
    rounds: int = rounds_option(),
):
    """Measure the profile's export in the serving engine it is for: the engine's greedy
    decoding, its own default speculative setting and autotune's export, side by side on
    the held-back prompts, every output checked against the engine's greedy output."""
    from autotune.commands.inputs import Remeasure, check_remeasure
    from autotune.profile.io import read_profile
    from autotune.verify import load_report_lines, report_lines, verify_load
    from autotune.verify import verify as verify_export

    fmt = output_format(fmt, json_out)
    others = "profile again with a larger prompts file"
    check_remeasure(profile_path, Remeasure(None, max_new_tokens, None, others))
    interrupt.tell(f"nothing was written ({profile_path} is as it was)")
    if concurrency is not None:
        load = verify_load(
            profile_path,
            _served_levels(concurrency, engine, tune),
            rounds,
            limit,
            max_new_tokens,
            gguf,
            record,
            draft_gguf,
        )
        echo_data(
            load.model_dump(),
            fmt,
            lambda _: load_report_lines(read_profile(profile_path).recommended, load),
        )
        _say_recorded(fmt, record, f"recorded in {profile_path} (load.engines.llamacpp)")
        return
    tuning = study_kept.kept_or_removed(storage) if tune is not None else nullcontext()
    with tuning:  # --tune's trials, in the study database
        report = verify_export(
            profile_path,
            engine.strip().lower(),
            limit,
            max_new_tokens,
            gguf,
            record,
            draft_gguf,
            duration(tune, "--tune"),
            storage,
        )
    echo_data(report.summary(), fmt, lambda _: report_lines(report))
    _say_recorded(fmt, record, f"recorded in {profile_path} (verified)")


def _say_recorded(fmt: Format, record: bool, line: str) -> None:
    """Where the figures were recorded, under the lines for people (data holds only data)."""
    if record and fmt is Format.table:
        typer.echo(line)


def _served_levels(concurrency: str, engine: str, tune: str | None) -> tuple[int, ...]:
    """``verify --concurrency``'s levels, given with what it needs."""
    from autotune.measure.load import parse_levels

    levels = parse_levels(concurrency)
    if engine.strip().lower() != "llamacpp" or not levels or tune is not None:
        raise AutotuneError(
            "--concurrency serves the export in llama-server with several slots: give "
            "--engine llamacpp, levels such as 1,2,4,8, and no --tune"
        )
    return levels
