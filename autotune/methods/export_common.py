"""What the methods' exporters share beyond ``autotune.export.base``: each engine's
exporter record (the release its option names follow, the file name an export to it
suggests: the same whichever method is exported), the vLLM and TensorRT-LLM
``speculative_config`` files with the schedule under load, and flag files."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from autotune.export import releases
from autotune.export.base import (
    Companion,
    Deployment,
    Exporter,
    Rendered,
    comment_lines,
    speculative_config,
)
from autotune.export.load import add_trtllm_cutoff, add_vllm_schedule

# The file an export to each engine suggests.
FILENAMES = {
    "vllm": "vllm_speculative_config.yaml",
    "sglang": "sglang_flags.txt",
    "trtllm": "trtllm_extra_llm_api_options.yaml",
    "hf": "generation_config.json",
    "llamacpp": "llamacpp_flags.txt",
}


def release(engine: str) -> str:
    """The release of ``engine`` whose option names the exports follow."""
    if engine == "hf":
        return releases.transformers()
    return {
        "vllm": releases.VLLM,
        "sglang": releases.SGLANG,
        "trtllm": releases.TRTLLM,
        "llamacpp": releases.LLAMACPP,
    }[engine]


def engine_exporter(engine: str, writes: str, render: Callable[[Deployment], Rendered]) -> Exporter:
    """A method's exporter to ``engine``; ``writes``: what of the release it writes
    ("speculative_config method eagle")."""
    return Exporter(
        engine=engine,
        engine_version=f"{release(engine)}: {writes}",
        filename=FILENAMES[engine],
        render=render,
    )


def vllm_file(
    exporter: Exporter,
    d: Deployment,
    config: dict,
    warnings: list[str],
    notes: list[str],
    method: str,
) -> Rendered:
    """vLLM's ``speculative_config`` with the schedule under load (``method``: the
    method's name in its warnings and notes), the dict also as one JSON line for
    ``--speculative-config``."""
    add_vllm_schedule(config, d.settings.load, warnings, notes, method)
    return speculative_config(exporter, d, config, warnings, notes, command_line=True)


def trtllm_file(
    exporter: Exporter,
    d: Deployment,
    config: dict,
    warnings: list[str],
    notes: list[str],
    draft_tokens: int,
) -> Rendered:
    """TensorRT-LLM's ``speculative_config`` with the cutoff under load (``draft_tokens``:
    the most a step drafts)."""
    add_trtllm_cutoff(config, d.settings.load, warnings, notes, draft_tokens)
    return speculative_config(exporter, d, config, warnings, notes)


def flags_file(
    exporter: Exporter,
    d: Deployment,
    warnings: list[str],
    notes: list[str],
    flags: Sequence[tuple[str, object]],
    one_line: bool = False,
    companion: Companion | None = None,
) -> Rendered:
    """A file of command-line flags under its ``#`` header: one flag a line, continued
    with backslashes (``one_line``: all on one line); a value of None writes the flag
    alone."""
    words = [
        flag if value is None else f"{flag} {shlex.quote(str(value))}" for flag, value in flags
    ]
    body = [" ".join(words)] if one_line else [w + " \\" for w in words[:-1]] + words[-1:]
    lines = comment_lines(exporter, d, warnings, notes) + body
    return Rendered("\n".join(lines) + "\n", warnings, companion=companion)
