"""Inputs that cannot do the job, refused in one line before any model is loaded (issue
43): a prompts file too small for the splits a command measures on, and a model whose
context cannot hold the answers it would decode."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.errors import AutotuneError, PromptsFileError
from autotune.measure.stats import MIN_PROMPTS
from autotune.prompts import Prompt, default_prompts_path, load_prompts, split_prompts
from autotune.workspace import DRAFT_ROOM  # what the check of every loaded prompt leaves

# The most prompts ``least_prompts`` looks through for a file large enough.
_LARGEST_ASKED = 10_000


def check_profile_prompts(prompts: str | None, heldback_asked: int) -> None:
    """``profile``'s prompts split into search prompts and enough held-back prompts for an
    interval: as many as asked, or ``MIN_PROMPTS`` (``measure.stats``: fewer give no
    interval worth reporting) where more were asked."""
    path = Path(prompts).expanduser() if prompts else default_prompts_path()
    loaded = load_prompts(path)
    needed = max(1, min(heldback_asked, MIN_PROMPTS))
    search, held = split_prompts(loaded)
    if search and len(held) >= needed:
        return
    least = least_prompts(needed)
    fewer = f", or --heldback-prompts {len(held)} to accept a wider interval" if held else ""
    raise PromptsFileError(
        f"{path} has {_count(len(loaded))}: its held-back quarter is {len(held)}, fewer than "
        f"the {needed} the held-back measurement needs (and {len(search)} left to search "
        f"on); give a file of at least {least} prompts{fewer}"
    )


def check_profile_heldback(profile_path: Path, what: str) -> None:
    """A command that measures on the held-back split of a profile's prompts file has at
    least one prompt there; ``what`` says how to measure on other prompts."""
    from autotune.bench import workload_prompts
    from autotune.profile.io import read_profile

    try:
        path = Path(workload_prompts(read_profile(profile_path).workload.prompts))
        loaded = load_prompts(path)
    except AutotuneError:
        return  # the profile or its prompts unreadable: the command says so, in its order
    if not split_prompts(loaded)[1]:
        raise PromptsFileError(
            f"{path} has {_count(len(loaded))}, too few to hold any back to measure on "
            f"(at least 2 are needed): {what}"
        )


def least_prompts(heldback: int) -> int:
    """The fewest prompts whose split holds ``heldback`` prompts back and searches on one."""
    for count in range(2, _LARGEST_ASKED):
        search, held = split_prompts([Prompt(str(i), "") for i in range(count)])
        if search and len(held) >= heldback:
            return count
    return _LARGEST_ASKED


def check_context_room(model: str, model_path: str | None, answer_tokens: int, option: str):
    """The model's context (``max_position_embeddings`` of its config.json, read without
    loading it) leaves room for a prompt after ``answer_tokens`` and the drafts verified
    past them. A GGUF file or a config without the field is checked once loaded."""
    from autotune.models import resolve_model

    resolved = resolve_model(model, model_path)
    context = _context_of(Path(resolved.path))
    if context is None or answer_tokens + DRAFT_ROOM < context:
        return
    raise AutotuneError(
        f"{resolved.name}'s context is {context} tokens: {answer_tokens} answer tokens and "
        f"{DRAFT_ROOM} for drafts leave no room for a prompt; give {option} below "
        f"{context - DRAFT_ROOM}"
    )


def _context_of(model_folder: Path) -> int | None:
    try:
        config = json.loads((model_folder / "config.json").read_text())
    except (OSError, ValueError):
        return None  # a GGUF file, or a config the loader will say is broken
    context = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return context if isinstance(context, int) and context > 0 else None


def _count(prompts: int) -> str:
    return f"{prompts} prompt{'s' if prompts != 1 else ''}"
