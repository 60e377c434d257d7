"""What a profile can hold in the right shape and still mean nothing: layer indices
outside its model, a recommended method it does not hold, sizes that are not positive.
The schema checks shape; these checks read the profile's own ``model`` block (layers,
hidden size, vocabulary), so no model is loaded. Each method says what is wrong with its
own block (``Method.problems``); a head folder the profile names and this machine lacks is
said too (``profile.travel``)."""

from __future__ import annotations

from collections.abc import Iterator

from autotune.methods import registry
from autotune.profile.blocks import Figures
from autotune.profile.schema import ProfileBase


def profile_problems(profile: ProfileBase) -> list[str]:
    """One line per problem, ``dotted.path: what is wrong`` (the schema's error form)."""
    return [
        *_registry(profile),
        *_sizes(profile),
        *_recommendation(profile),
        *_methods(profile),
        *profile.missing(),
    ]


def model_problem(profile: ProfileBase) -> str | None:
    """The profile's model block against what autotune knows of the model it names (an
    alias's layers, hidden size and vocabulary; the fingerprint of a known file)."""
    from autotune.models.registry import architecture_mismatch

    model = profile.model
    facts = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "vocab_size": model.vocab_size,
    }
    return architecture_mismatch(model.name, model.repo, facts, model.fingerprint)


def _registry(profile: ProfileBase) -> Iterator[str]:
    problem = model_problem(profile)
    if problem is not None:
        yield f"model: {problem}"


def _positive(where: str, value: float | None, *, zero: bool = False) -> Iterator[str]:
    if value is None:
        return
    if value < 0 or (value == 0 and not zero):
        yield f"{where}: got {value}; expected a number {'>= 0' if zero else '> 0'}"


def _sizes(profile: ProfileBase) -> Iterator[str]:
    model, workload, hardware = profile.model, profile.workload, profile.hardware
    for name in ("num_layers", "hidden_size", "vocab_size"):
        yield from _positive(f"model.{name}", getattr(model, name))
    yield from _positive("workload.num_prompts", workload.num_prompts)
    yield from _positive("workload.max_new_tokens", workload.max_new_tokens)
    yield from _positive("workload.temperature", workload.temperature, zero=True)
    yield from _positive("hardware.threads", hardware.threads)
    yield from _positive("hardware.cores", hardware.cores)
    for name, block in profile.method_blocks().items():
        for part in ("measured", "selection"):
            figures = getattr(block, part, None)
            if figures is not None:
                yield from _figures(f"methods.{name}.{part}", figures)
                for category, own in (getattr(figures, "by_category", None) or {}).items():
                    yield from _figures(f"methods.{name}.{part}.by_category.{category}", own)


def _figures(where: str, figures: Figures) -> Iterator[str]:
    for name in ("speedup", "tokens_per_s", "baseline_tokens_per_s", "prompts"):
        yield from _positive(f"{where}.{name}", getattr(figures, name))
    yield from _positive(f"{where}.tokens_per_step", figures.tokens_per_step, zero=True)
    yield from _positive(f"{where}.tokens", figures.tokens, zero=True)
    if not 0.0 <= figures.acceptance_rate <= 1.0:
        yield f"{where}.acceptance_rate: got {figures.acceptance_rate}; expected 0 to 1"
    interval = figures.speedup_interval
    if interval is not None and (len(interval) != 2 or interval[0] > interval[1]):
        yield f"{where}.speedup_interval: got {interval}; expected [low, high], low <= high"


def _recommendation(profile: ProfileBase) -> Iterator[str]:
    held = list(profile.method_blocks())
    choices = ", ".join([*held, "none"])
    if profile.recommended != "none" and profile.recommended not in held:
        yield (
            f"recommended: got {profile.recommended!r}, a method this profile does not hold "
            f"(expected one of: {choices})"
        )
    verdict = profile.verdict
    if verdict is not None and verdict.recommended != profile.recommended:
        yield (
            f"verdict.recommended: got {verdict.recommended!r}; expected the profile's "
            f"recommended method, {profile.recommended!r}"
        )


def _methods(profile: ProfileBase) -> Iterator[str]:
    for name, block in profile.method_blocks().items():
        for problem in registry.method(name).problems(block, profile.model):
            yield f"methods.{name}.{problem}"
