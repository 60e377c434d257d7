"""The ``cape`` block a chain method's profile entry may hold, and its conversion to the
drafter's policy."""

from __future__ import annotations

from pydantic import Field, model_validator

from autotune.drafters.cape import CapePolicy
from autotune.profile.blocks import Block, Measured


class CapeSettings(Block):
    """Confidence-aware proposal expansion on a chain drafter. A drafting step whose top-1
    probability p lies in (bins[i - 1], bins[i]] proposes expansion[i] tokens: the chain's
    own and expansion[i] - 1 runner-ups beside it, never extended."""

    bins: list[float]  # upper edges of the confidence bins, ascending to 1.0
    expansion: list[int]  # tokens proposed per step, one per bin
    max_verify_tokens: int = Field(32, ge=2)  # the verified tree's size, its root included
    chain_depth: int | None = Field(None, ge=1)  # a tree method's chain length (EAGLE)
    # drafted with it: chosen over the plain drafter on the search split (the method's
    # `measured` figures are then with expansion)
    enabled: bool = True
    measured: Measured | None = None  # profiles of autotune before 0.2: held-back, with it
    predicted_speedup: float | None = None  # the fit's replay on calibration decoding
    search: dict = Field(default_factory=dict)

    @model_validator(mode="after")
    def _a_valid_policy(self):
        self.policy()
        return self

    def policy(self) -> CapePolicy:
        return CapePolicy(tuple(self.bins), tuple(self.expansion), self.max_verify_tokens)

    @classmethod
    def of(cls, policy: CapePolicy, **rest) -> CapeSettings:
        return cls(
            bins=list(policy.edges),
            expansion=list(policy.expansion),
            max_verify_tokens=policy.max_verify_tokens,
            **rest,
        )
