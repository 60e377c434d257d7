"""What the measured trials of the methods that draft with a model (Medusa, EAGLE, GLIDE,
self-speculation) share: one setting's drafter decoded against plain greedy."""

from __future__ import annotations

from collections.abc import Callable

from autotune.engine.proposal import Drafter
from autotune.measure.timing import EncodedPrompt, Measurement, measure_side_by_side
from autotune.models.ref import TargetRef


def measure_lossless(
    target: TargetRef,
    make_drafter: Callable[[], Drafter],
    prompts: list[EncodedPrompt],
    max_new_tokens: int,
    name: str,
) -> Measurement:
    """The drafter decoded side by side with plain greedy on ``prompts``; one whose output
    differed (a bug: speculation is exact) fails the trial, ``name`` saying whose."""
    measured = measure_side_by_side(target.runner(), make_drafter, prompts, max_new_tokens)
    if measured.lossless is False:
        raise RuntimeError(
            f"{name} output differed from plain greedy output ({measured.first_loss()})"
        )
    return measured
