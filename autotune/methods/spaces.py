"""Parts of search spaces that several methods share. A method's defaults live only in
its package's ``space.yaml``: the models here have none."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Grid values: a count or size of at least one, a positive factor, a probability.
Count = Annotated[int, Field(ge=1)]
Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Calibration(Strict):
    prompts: int = Field(ge=1)  # search prompts whose greedy continuations are measured
    tokens: int = Field(ge=2)  # continuation length


class Trials(Strict):
    """Wall-clock trials on search prompts."""

    prompts: int = Field(ge=1)
    tokens: int = Field(ge=2)
