"""The GLIDE block of a profile, and its conversion to the drafter's exit policy."""

from __future__ import annotations

from pydantic import Field

from autotune.drafters.self_spec import DraftExitPolicy
from autotune.methods.cape.settings import CapeSettings, ChainCaps
from autotune.profile.blocks import Block, MethodSettings


class GlideDraftExit(Block):
    """Drafting ends after ``max_tokens`` or at the first later step whose top-1
    probability is below ``exit_threshold`` (the first token is always proposed)."""

    max_tokens: int = Field(ge=1)
    exit_threshold: float = Field(ge=0.0, le=1.0)


class GlideSettings(ChainCaps, MethodSettings):
    head: str  # the draft's folder (our layout or the reference's)
    draft: GlideDraftExit
    # the draft's lm_head covers the folder's N most frequent tokens (0: all of them)
    draft_vocab: int = Field(0, ge=0)
    # with CAPE enabled, its ``chain_depth`` replaces draft.max_tokens
    cape: CapeSettings | None = None

    @classmethod
    def of(cls, head: str, policy: DraftExitPolicy, **rest) -> GlideSettings:
        draft = GlideDraftExit(
            max_tokens=policy.max_tokens, exit_threshold=round(policy.exit_threshold, 4)
        )
        return cls(head=head, draft=draft, **rest)

    def exit_policy(self, depth: int | None = None) -> DraftExitPolicy:
        """The drafter's rule; ``depth`` (a CAPE chain's) replaces the draft length."""
        return DraftExitPolicy(depth or self.draft.max_tokens, self.draft.exit_threshold, None)
