"""The head kinds autotune trains, registered like the methods: each with its options,
its trainer and the least training time worth measuring."""

from __future__ import annotations

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

    def _load(self, attr: str) -> Any:
        return getattr(importlib.import_module(f"autotune.training.{self.module}"), attr)

    def options(self) -> Any:
        """The options it trains with unless told otherwise."""
        return self._load(self.options_class)()

    def train(self) -> Callable[..., Any]:
        return self._load(self.trainer)


KINDS: dict[str, HeadKind] = {
    kind.name: kind
    for kind in (
        HeadKind("medusa", "medusa", "MedusaOptions", "train_medusa", 45.0),
        HeadKind("eagle", "eagle", "EagleOptions", "train_eagle", 45.0),
        # A GLIDE draft first runs the target over every training sequence for its cache
        # (about a minute on 2 cores for SmolLM2-135M), and learned nothing measurable
        # (top-1 0.002) in the 100 s after it that a 20-minute budget leaves.
        HeadKind("glide", "glide", "GlideOptions", "train_glide", 300.0),
    )
}


def kind(name: str) -> HeadKind:
    if name not in KINDS:
        raise AutotuneError(f"unknown head kind '{name}': choose from {', '.join(KINDS)}")
    return KINDS[name]
