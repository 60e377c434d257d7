"""The head kinds autotune trains, registered like the methods: each with its options,
its trainer and the least training time worth measuring."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.errors import AutotuneError


@dataclass(frozen=True)
class HeadKind:
    name: str
    module: str  # autotune.training.<module> holds the options class and the trainer
    options_class: str
    trainer: str
    # Less training than this measured nothing useful on 2 cores: the kind is skipped.
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
