"""The self-speculative block of a profile, and its conversion to and from the drafter's
own objects (the skip mask, the draft-exit policy): the one place that converts."""

from __future__ import annotations

from pydantic import Field

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy
from autotune.engine.skip import SkipMask
from autotune.methods.cape.settings import CapeSettings, ChainCaps
from autotune.profile.blocks import Block, MethodSettings


class SkipLayers(Block):
    attention: list[int]
    mlp: list[int]


class Adaptive(Block):
    target_acceptance: float
    step: float
    beta1: float
    beta2: float


class DraftSettings(Block):
    max_tokens: int = Field(ge=1)
    exit_threshold: float = Field(ge=0.0, le=1.0)
    adaptive: Adaptive | None = None


class SelfSpecSettings(ChainCaps, MethodSettings):
    skip: SkipLayers
    draft: DraftSettings
    cape: CapeSettings | None = None

    @classmethod
    def of(cls, skip: SkipMask, policy: DraftExitPolicy, **rest) -> SelfSpecSettings:
        rule = policy.adaptive
        return cls(
            skip=SkipLayers(**skip.as_dict()),
            draft=DraftSettings(
                max_tokens=policy.max_tokens,
                exit_threshold=round(policy.exit_threshold, 4),
                adaptive=None if rule is None else Adaptive(**rule.__dict__),
            ),
            **rest,
        )

    def skip_mask(self) -> SkipMask:
        return SkipMask.of(self.skip.attention, self.skip.mlp)

    def exit_policy(self) -> DraftExitPolicy:
        rule = self.draft.adaptive
        return DraftExitPolicy(
            self.draft.max_tokens,
            self.draft.exit_threshold,
            None if rule is None else AdaptiveExit(**rule.model_dump()),
        )
