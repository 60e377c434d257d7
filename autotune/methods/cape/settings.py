"""The ``cape`` block a chain method's profile entry may hold, and its conversion to the
drafter's policy."""

from __future__ import annotations

from typing import Any

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

    def draft_size(self, chain: int) -> int:
        """The most tokens a step drafts over a chain of ``chain`` tokens: each chain
        token and its siblings, within the verify budget."""
        return min(self.max_verify_tokens - 1, chain * max(self.expansion))

    def capped(self, tokens: int) -> CapeSettings:
        """At most ``tokens`` draft tokens a step: a smaller verified tree, and a chain no
        longer than that (``measure.load``)."""
        depth = self.chain_depth
        return self.model_copy(
            update={
                "max_verify_tokens": min(self.max_verify_tokens, tokens + 1),
                "chain_depth": None if depth is None else min(depth, tokens),
            }
        )

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


class ChainCaps:
    """Draft size and caps of a chain method's settings: a ``draft`` block with
    ``max_tokens`` and an optional ``cape`` block (self-speculation, GLIDE)."""

    draft: Any
    cape: CapeSettings | None

    def draft_size(self) -> int:
        if self.cape is not None and self.cape.enabled:
            return self.cape.draft_size(self.cape.chain_depth or self.draft.max_tokens)
        return self.draft.max_tokens

    def capped(self, tokens: int) -> Any:
        draft = self.draft.model_copy(update={"max_tokens": min(self.draft.max_tokens, tokens)})
        cape = None if self.cape is None else self.cape.capped(tokens)
        return self.model_copy(update={"draft": draft, "cape": cape})  # type: ignore[attr-defined]
