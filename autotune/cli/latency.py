"""`autotune latency`: this device's verify-latency curve."""

from __future__ import annotations

import typer

from autotune.cli.errors import user_errors
from autotune.cli.options import (
    MODEL_HELP,
    MODEL_PATH_HELP,
    THREADS_HELP,
    console,
    device_option,
    dtype_option,
    json_option,
    output_format,
    set_torch_threads,
)
from autotune.output import Format, format_option, render


@user_errors
def latency(
    model: str = typer.Option("smollm2-135m", help=MODEL_HELP),
    model_path: str | None = typer.Option(None, help=MODEL_PATH_HELP),
    random_weights: bool = typer.Option(
        False,
        "--random-weights",
        help="Build the model from its architecture alone (an alias's "
        "known shapes, or a folder's config.json) with random weights and no tokenizer: time a "
        "device before the weights are on it.",
    ),
    max_tokens: int | None = typer.Option(
        None, min=1, help="Verify sizes n = 1..N new tokens (default 16; 64 with --roofline)."
    ),
    roofline: bool = typer.Option(
        False,
        "--roofline",
        help="Also measure this machine's memory bandwidth and GEMM peak in the dtype, and "
        "print each size's floor, max(weight bytes / bandwidth, flops / peak), and the "
        "curve's ratio to it (sizes past 16 timed on a grid, the rest interpolated).",
    ),
    dtype: str = dtype_option(),
    device: str = device_option(),
    json_out: bool = json_option(),
    fmt: Format = format_option(),
    threads: int | None = typer.Option(None, min=1, help=THREADS_HELP),
):
    """This device's verify-latency curve: the time of one target forward over n new tokens
    after a context, and its cost relative to one token."""
    from autotune.measure.device_latency import (
        DEFAULT_MAX_TOKENS,
        ROOFLINE_MAX_TOKENS,
        LatencyRequest,
        latency_heading,
        latency_table,
        measure_device_latency,
        roofline_line,
    )

    set_torch_threads(threads)
    result = measure_device_latency(
        LatencyRequest(
            model=model,
            model_path=model_path,
            random_weights=random_weights,
            max_tokens=max_tokens or (ROOFLINE_MAX_TOKENS if roofline else DEFAULT_MAX_TOKENS),
            dtype=dtype,
            device=device,
            roofline=roofline,
        )
    )
    fmt = output_format(fmt, json_out)
    if fmt is not Format.table:
        typer.echo(render(result.as_dict(), fmt))
        return
    typer.echo(latency_heading(result))
    if (line := roofline_line(result)) is not None:
        typer.echo(line)
    console().print(latency_table(result))
