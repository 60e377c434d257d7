"""The self-speculative method's search space (defaults: ``space.yaml`` beside this)."""

from __future__ import annotations

from pydantic import Field, model_validator

from autotune.methods.spaces import Calibration, Strict, Trials


class SkipMaskSpace(Strict):
    keep_first: int = Field(ge=0)
    keep_last: int = Field(ge=0)
    min_skip_ratio: float
    max_skip_ratio: float
    trials: int = Field(ge=1)
    sampler: str
    confirm_top: int = Field(ge=1)
    max_tokens_choices: list[int]
    exit_threshold_choices: list[float]

    @model_validator(mode="after")
    def _check(self):
        if not 0 <= self.min_skip_ratio < self.max_skip_ratio <= 1:
            raise ValueError("need 0 <= min_skip_ratio < max_skip_ratio <= 1")
        if self.sampler not in ("gp", "skopt"):
            raise ValueError("sampler must be 'gp' or 'skopt'")
        return self

    def skippable_layers(self, num_layers: int) -> list[int]:
        return list(range(self.keep_first, num_layers - self.keep_last))


class DraftExitSpace(Strict):
    trials: int = Field(ge=0)
    max_tokens: tuple[int, int]
    exit_threshold: tuple[float, float]
    adaptive: list[bool]
    target_acceptance: tuple[float, float]
    step: tuple[float, float]
    beta1: tuple[float, float]
    beta2: tuple[float, float]


class SelfSpecSpace(Strict):
    skip_mask: SkipMaskSpace
    draft_exit: DraftExitSpace
    calibration: Calibration
    trials: Trials
