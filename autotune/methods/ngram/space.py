"""The n-gram method's search space (defaults: ``space.yaml`` beside this)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from autotune.methods.spaces import Calibration, Count, Fraction, Positive, Strict, Trials


class Grid(Strict):
    """A kind's grids: none empty, and some match window in them."""

    min_match: list[Count]
    max_match: list[Count]

    @model_validator(mode="after")
    def _check(self):
        for name, values in self:
            if isinstance(values, list) and not values:
                raise ValueError(f"{name}: the grid is empty")
        if min(self.min_match) > max(self.max_match):
            raise ValueError("no min_match of the grid is <= a max_match of it")
        return self


class Start(Strict):
    """Where a kind's search starts: its engine's default."""

    min_match: int = Field(ge=1)
    max_match: int = Field(ge=1)
    draft_tokens: int = Field(ge=1)


class NgramStart(Start):
    candidates: int = Field(ge=1)
    branch_tokens: int = Field(ge=1)
    max_tree_tokens: int = Field(ge=1)
    prefer: Literal["recent", "first"]


class NgramGrid(Grid):
    """Prompt lookup: the values the search may choose, and where it starts."""

    draft_tokens: list[Count]
    candidates: list[Count]
    branch_tokens: list[Count]
    max_tree_tokens: list[Count]
    prefer: list[Literal["recent", "first"]]
    start: NgramStart


class SuffixStart(Start):
    max_tree_tokens: int = Field(ge=1)
    tokens_per_match: float = Field(gt=0)
    min_probability: float = Field(ge=0, le=1)


class SuffixGrid(Grid):
    """Suffix decoding: the values the search may choose, and where it starts."""

    draft_tokens: list[Count]
    max_tree_tokens: list[Count]
    tokens_per_match: list[Positive]
    min_probability: list[Fraction]
    start: SuffixStart


class SearchSpace(Strict):
    passes: int = Field(ge=1)  # coordinate-ascent sweeps over every setting
    finalists: int = Field(ge=1)  # best distinct proxy settings of each kind measured


class StudySpace(Strict):
    trials: int = Field(ge=0)  # measured trials (0: the proxy's finalists are measured alone)
    prompts: int = Field(ge=1)  # of the timed prompts, those a whole trial decodes
    grace: int = Field(ge=1)  # prompts every trial decodes before ASHA may prune it
    proxy_screen: float = Field(gt=0, le=1)  # pruned unpredicted below this x the best


class PerCategory(Strict):
    min_gain: float = Field(ge=0)  # a category's own setting must be this much faster ...
    confidence: float = Field(gt=0, lt=1)  # ... and its interval's low end above 1.0


class NgramSpace(Strict):
    calibration: Calibration
    ngram: NgramGrid
    suffix: SuffixGrid
    search: SearchSpace
    study: StudySpace
    per_category: PerCategory
    trials: Trials
