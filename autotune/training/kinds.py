"""The head kinds autotune trains, registered like the methods: each with its options,
its trainer and the least training time worth measuring, on the machine the floors were
measured on and, scaled by how fast the target runs, on this one."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune import plan
from autotune.errors import AutotuneError

# Where the kinds' least training times were measured: SmolLM2-135M in float32 on 2 AMD
# EPYC cores, whose target forward over 128 new tokens took 280 ms (`autotune latency
# --model smollm2-135m --max-tokens 128`, 2026-11-28), 2.19 ms a token. Training is
# batched forwards (the target's over the answers, the head's with its backward), so a
# machine and model that run such a forward k times faster train as much in 1/k the time.
CALIBRATION_S_PER_TOKEN = 0.280 / 128


@dataclass(frozen=True)
class HeadKind:
    name: str
    module: str  # autotune.training.<module> holds the options class and the trainer
    options_class: str
    trainer: str
    # Less training than this measured nothing useful on 2 cores (CALIBRATION_S_PER_TOKEN):
    # the kind is skipped. Elsewhere: ``least_training_s``.
    min_training_s: float
    # Options other kinds take that this one has none of, each with why (the refusal a
    # user reads for passing one): (option, why).
    lacks: tuple[tuple[str, str], ...] = ()

    def _load(self, attr: str) -> Any:
        return getattr(importlib.import_module(f"autotune.training.{self.module}"), attr)

    def options(self) -> Any:
        """The options it trains with unless told otherwise."""
        return self._load(self.options_class)()

    def options_with(self, given: dict[str, Any]) -> Any:
        """The default options with the values ``given`` that are not None in their place;
        an option the kind does not have is refused."""
        chosen = {option: value for option, value in given.items() if value is not None}
        defaults = self.options()
        known = {field.name for field in dataclasses.fields(defaults)}
        for option in chosen:
            if option not in known:
                raise AutotuneError(self._refusal(option, sorted(known)))
        return dataclasses.replace(defaults, **chosen)

    def _refusal(self, option: str, known: list[str]) -> str:
        flag = "--" + option.replace("_", "-")  # as the CLI spells it
        why = dict(self.lacks).get(option)
        if why is not None:
            return f"{flag} {why}; leave {flag} out"
        return f"{self.name} heads have no option '{option}': they take {', '.join(known)}"

    def least_training_s(self, seconds_per_token: float) -> float:
        """The least training worth measuring where the target's batched forward takes
        ``seconds_per_token`` a token: ``min_training_s`` scaled from the machine it was
        measured on (a GPU's seconds, not 2 cores', or a larger model's), never under a
        probe's least and, after it, the least a training gets (``plan.PROBE_LEAST_S`` +
        ``plan.LEAST_TRAINING_S``): the plan gives a kind still in the race its probe's
        least whatever its share, so a floor below that would keep every kind, and a
        trainer's own start (the head built, its data laid out) does not shrink with the
        machine."""
        scaled = self.min_training_s * seconds_per_token / CALIBRATION_S_PER_TOKEN
        return max(scaled, plan.PROBE_LEAST_S + plan.LEAST_TRAINING_S)

    def train(self) -> Callable[..., Any]:
        return self._load(self.trainer)


KINDS: dict[str, HeadKind] = {
    kind.name: kind
    for kind in (
        HeadKind("medusa", "medusa", "MedusaOptions", "train_medusa", 45.0),
        HeadKind(
            "eagle",
            "eagle",
            "EagleOptions",
            "train_eagle",
            45.0,
            lacks=(
                (
                    "num_heads",
                    "is for Medusa heads only: an EAGLE head is one decoder layer that "
                    "drafts depth by depth",
                ),
            ),
        ),
        # A GLIDE draft first runs the target over every training sequence for its cache
        # (about a minute on 2 cores for SmolLM2-135M), and learned nothing measurable
        # (top-1 0.002) in the 100 s after it that a 20-minute budget leaves.
        HeadKind(
            "glide",
            "glide",
            "GlideOptions",
            "train_glide",
            300.0,
            lacks=(
                (
                    "num_heads",
                    "is for Medusa heads only: a GLIDE draft is a small decoder that "
                    "drafts token by token",
                ),
            ),
        ),
    )
}


def kind(name: str) -> HeadKind:
    if name not in KINDS:
        raise AutotuneError(f"unknown head kind '{name}': choose from {', '.join(KINDS)}")
    return KINDS[name]
