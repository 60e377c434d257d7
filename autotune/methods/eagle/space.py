"""The EAGLE method's search space (defaults: ``space.yaml`` beside this)."""

from __future__ import annotations

from pydantic import Field, model_validator

from autotune.methods.spaces import Calibration, Strict, Trials


class HeadCalibration(Calibration):
    max_rank: int = Field(ge=1)  # ranks counted per depth (the widest a static tree branches)
    max_depth: int = Field(ge=1)  # drafting steps measured (the deepest a tree can be)
    # draft vocabularies tried: the most frequent N tokens of the head's training answers
    # (0: the whole vocabulary; heads without a ranked token list use only that)
    draft_vocab: list[int]


class StaticSpace(Strict):
    max_nodes: int  # size cap; the verify curve is measured to max_nodes + 1
    candidates: int  # best predicted (depth, size) trees measured first
    trials: int  # measured trials in the static-tree study


class DynamicSpace(Strict):
    total_tokens: tuple[int, int]  # verified tokens per step, root included
    depth: tuple[int, int]  # expansions after the first level
    top_k: tuple[int, int]
    trials: int  # measured trials in the dynamic-tree study

    @model_validator(mode="after")
    def _check(self):
        for name in ("total_tokens", "depth", "top_k"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"{name}: the lower bound {low} exceeds the upper {high}")
        if self.total_tokens[0] < 2 or self.top_k[0] < 1 or self.depth[0] < 0:
            raise ValueError("need total_tokens >= 2, top_k >= 1, depth >= 0")
        return self


class EagleSpace(Strict):
    calibration: HeadCalibration
    static: StaticSpace
    dynamic: DynamicSpace
    trials: Trials
