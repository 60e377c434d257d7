"""The GLIDE method's search space (defaults: ``space.yaml`` beside this)."""

from __future__ import annotations

from pydantic import Field, model_validator

from autotune.methods.spaces import Calibration, Strict, Trials


class DraftCalibration(Calibration):
    max_depth: int = Field(ge=1)  # drafting steps measured: the longest draft tried
    # draft vocabularies tried: the N tokens the target emitted most often in the draft's
    # training answers (0: the whole vocabulary; drafts without that list use only 0)
    draft_vocab: list[int]


class DraftExitSpace(Strict):
    max_tokens: tuple[int, int]  # the draft length's range
    exit_threshold: tuple[float, float]
    grid_thresholds: list[float]  # exit thresholds the replay scores at every length
    anchor: dict  # the reference's setting, measured as a trial of its own
    candidates: int = Field(ge=0)  # best predicted settings, measured first
    trials: int = Field(ge=0)  # measured trials, the candidates and the anchor included

    @model_validator(mode="after")
    def _check(self):
        low, high = self.max_tokens
        if not 1 <= low <= high:
            raise ValueError("max_tokens: need 1 <= low <= high")
        t_low, t_high = self.exit_threshold
        if not 0.0 <= t_low <= t_high <= 1.0:
            raise ValueError("exit_threshold: need 0 <= low <= high <= 1")
        if not self.grid_thresholds or not all(0 <= t <= 1 for t in self.grid_thresholds):
            raise ValueError("grid_thresholds: need at least one, each within 0..1")
        if set(self.anchor) != {"max_tokens", "exit_threshold"}:
            raise ValueError("anchor: give max_tokens and exit_threshold")
        return self


class GlideSpace(Strict):
    calibration: DraftCalibration
    draft: DraftExitSpace
    trials: Trials

    @model_validator(mode="after")
    def _deep_enough(self):
        if self.calibration.max_depth < self.draft.max_tokens[1]:
            raise ValueError(
                "calibration.max_depth must reach draft.max_tokens' upper bound: the "
                "replay needs every step a draft may take"
            )
        return self
