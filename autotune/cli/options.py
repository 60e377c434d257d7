"""What several commands share: help texts, and helpers for the options they read and
the tables they print."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.errors import AutotuneError
from autotune.methods import registry

if TYPE_CHECKING:
    from rich.console import Console

MODEL_HELP = "Alias, Hugging Face repo id (from the local cache), model folder or .gguf file."
MODEL_PATH_HELP = "Where the weights of the alias are."
PROMPTS_HELP = "JSONL calibration prompts (default: MT-bench)."
DEVICE_HELP = "auto (a GPU when there is one, else the CPU), cpu, cuda or cuda:N."
DTYPE_HELP = (
    "auto (bfloat16 or float16 on a GPU, float32 on the CPU), float32, bfloat16 or float16."
)
THREADS_HELP = "Torch threads (default: all cores)."
STORAGE_HELP = (
    "Study database SQLAlchemy URL (default $AUTOTUNE_STORAGE or sqlite:///studies/autotune.db)."
)
ROUNDS_HELP = "With --concurrency: rounds of prompts a level."


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
