"""Inputs that cannot do the job, refused in one line before any model is loaded (issue
43): a prompts file too small for the splits a command measures on, and a model whose
context cannot hold the answers it would decode."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Remeasure:
    """What `bench` and `verify` measure a profile on: its held-back prompts unless
    ``prompts`` are given (``what`` says how to give others), this many tokens each (None:
    the profile's), on its model or the one at ``model_path``."""

    prompts: str | None
    max_new_tokens: int | None
    model_path: str | None
    what: str


def check_remeasure(profile_path: Path, asked: Remeasure) -> None:
    """The profile's held-back split holds a prompt (where it is measured on), and its
    model's context the answers. A profile, prompts file or model that cannot be read is
    left to the command to say, in its order."""
    from autotune.bench import find_model, workload_prompts
    from autotune.profile.io import read_profile

    try:
        profile = read_profile(profile_path)
        path = Path(asked.prompts or workload_prompts(profile.workload.prompts))
        loaded = load_prompts(path)
        model = profile.model.name if asked.model_path else find_model(profile.model)
    except AutotuneError:
        return
    if asked.prompts is None and not split_prompts(loaded)[1]:
        raise PromptsFileError(
            f"{path} has {_count(len(loaded))}, too few to hold any back to measure on "
            f"(at least 2 are needed): {asked.what}"
        )
    tokens = asked.max_new_tokens or profile.workload.max_new_tokens
    check_context_room(model, asked.model_path, tokens, "--max-new-tokens")


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


def check_heads_fit(heads: dict[str, str], model: str, model_path: str | None) -> None:
    """Each ``--heads METHOD=DIR`` was made for a model of this one's shapes (its
    config.json's hidden size and vocabulary, those the method's heads share with the
    model), read before either is loaded; heads of the right shapes trained for another
    model (autotune's record of the model's fingerprint) are said in a warning."""
    from autotune.methods import registry
    from autotune.models import resolve_model
    from autotune.models.registry import fingerprint
    from autotune.progress import say

    if not heads:
        return
    resolved = resolve_model(model, model_path)
    model_config = _config_of(Path(resolved.path)) or {}
    for method, given in heads.items():
        config = _config_of(Path(given).expanduser()) or {}
        shared = [f for f in SHARED_SHAPES.get(method, ()) if f in config and f in model_config]
        wrong = [
            f"{f} {config[f]} (the model's {model_config[f]})"
            for f in shared
            if config[f] != model_config[f]
        ]
        kind = registry.method(method).heads or method
        if wrong:
            raise AutotuneError(
                f"--heads {method}={given}: made for another model, with {', '.join(wrong)}; "
                f"train heads for {resolved.name} with `autotune heads train --kind {kind} "
                f"--model {model}`"
            )
        made_for = (config.get("autotune") or {}).get("model_fingerprint")
        if made_for and made_for != fingerprint(resolved):
            say(
                f"[yellow]warning: --heads {method}={given} were trained for model "
                f"{made_for}, not {resolved.name} ({fingerprint(resolved)}): they may "
                "draft poorly for it[/yellow]"
            )


# What a method's heads share with the model, by the names of their config.json (a
# GLIDE draft may have a hidden size of its own, never a vocabulary of its own).
SHARED_SHAPES = {
    "medusa": ("hidden_size", "vocab_size"),
    "eagle": ("hidden_size", "vocab_size"),
    "glide": ("vocab_size",),
}


def _context_of(model_folder: Path) -> int | None:
    context = (_config_of(model_folder) or {}).get("max_position_embeddings")
    return context if isinstance(context, int) and context > 0 else None


def _config_of(folder: Path) -> dict | None:
    """The folder's config.json (None: a GGUF file, or a config its loader will say is
    broken)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _count(prompts: int) -> str:
    return f"{prompts} prompt{'s' if prompts != 1 else ''}"
