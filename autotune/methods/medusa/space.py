"""The Medusa method's search space (defaults: ``space.yaml`` beside this)."""

from __future__ import annotations

from pydantic import Field, model_validator

from autotune.methods.spaces import Calibration, Strict, Trials


class HeadCalibration(Calibration):
    max_rank: int = Field(ge=1)  # ranks counted per head (the top-k table's width)


class TreeSpace(Strict):
    max_nodes: int  # tree-size cap; the verify curve is measured to max_nodes + 1
    builders: list[str]
    candidates: int  # best predicted (heads, size, builder) confirmed by wall clock
    trials: int  # measured trials in the study (candidates first)

    @model_validator(mode="after")
    def _check(self):
        unknown = set(self.builders) - {"greedy", "sequoia"}
        if unknown or not self.builders:
            raise ValueError(f"builders must be among greedy, sequoia (got {self.builders})")
        if not 1 <= self.max_nodes <= 255:
            raise ValueError("max_nodes must be within 1..255")
        return self


class TypicalSpace(Strict):
    temperature: float  # sampling temperature the sweep decodes at
    pairs: list[tuple[float, float]]
    min_fidelity: float | None  # None: that of Medusa's defaults (0.09, 0.3)
    prompts: int
    tokens: int


class MedusaSpace(Strict):
    calibration: HeadCalibration
    tree: TreeSpace
    trials: Trials
    typical: TypicalSpace
