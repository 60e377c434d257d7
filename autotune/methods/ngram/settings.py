"""The n-gram block of a profile, and its conversion to and from the drafters' own
settings (``LookupConfig``, ``SuffixConfig``): the one place that converts.

```yaml
ngram:
  draft: {kind: ngram, min_match: 1, max_match: 3, draft_tokens: 8, candidates: 3,
          branch_tokens: 2, max_tree_tokens: 16, prefer: recent}
  by_category:                 # workload categories that measured faster with their own
    translation: {kind: suffix, min_match: 2, max_match: 8, draft_tokens: 8,
                  max_tree_tokens: 4, tokens_per_match: 0.5, min_probability: 0.2}
```
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from autotune.drafters.engine_lookup import EngineLookupConfig
from autotune.drafters.ngram import LookupConfig
from autotune.drafters.suffix import SuffixConfig
from autotune.profile.blocks import Block, MethodSettings


class _Match(Block):
    min_match: int = Field(ge=1)
    max_match: int = Field(ge=1)
    draft_tokens: int = Field(ge=1)
    max_tree_tokens: int = Field(ge=1, le=256)

    @model_validator(mode="after")
    def _ordered(self):
        if self.min_match > self.max_match:
            raise ValueError(
                f"min_match ({self.min_match}) must not exceed max_match ({self.max_match})"
            )
        return self


class NgramLookup(_Match):
    """Prompt lookup widened to a tree (``drafters.ngram.LookupConfig``)."""

    kind: Literal["ngram"] = "ngram"
    candidates: int = Field(ge=1)
    branch_tokens: int = Field(ge=1)
    prefer: Literal["recent", "first"]


class SuffixLookup(_Match):
    """Suffix decoding over the sequence (``drafters.suffix.SuffixConfig``)."""

    kind: Literal["suffix"] = "suffix"
    tokens_per_match: float = Field(gt=0)
    min_probability: float = Field(ge=0.0, le=1.0)


class EngineLookup(Block):
    """A serving engine's own prompt lookup (``drafters.engine_lookup.EngineLookupConfig``):
    the setting exported to that engine, drafting as it drafts."""

    kind: Literal["engine"] = "engine"
    engine: Literal["hf", "vllm", "trtllm", "llamacpp"]
    min_match: int = Field(ge=1)
    max_match: int = Field(ge=1)
    draft_tokens: int = Field(ge=1)
    prefer: Literal["recent", "first"]


AnyLookup = NgramLookup | SuffixLookup | EngineLookup
LookupBlock = Annotated[AnyLookup, Field(discriminator="kind")]
Config = LookupConfig | SuffixConfig | EngineLookupConfig


def config_of(block: AnyLookup) -> Config:
    """The drafter's settings for a block."""
    values = block.model_dump(exclude={"kind"})
    if block.kind == "engine":
        return EngineLookupConfig(**values)
    return LookupConfig(**values) if block.kind == "ngram" else SuffixConfig(**values)


def block_of(config: Config) -> AnyLookup:
    """The block for a drafter's settings."""
    values = dict(config.__dict__)
    if isinstance(config, EngineLookupConfig):
        return EngineLookup(**values)
    return NgramLookup(**values) if isinstance(config, LookupConfig) else SuffixLookup(**values)


def draft_size(block: AnyLookup) -> int:
    """The most tokens one draft of this setting holds."""
    return block.draft_tokens if block.kind == "engine" else block.max_tree_tokens


def capped(block: AnyLookup, tokens: int) -> AnyLookup:
    """The setting with at most ``tokens`` draft tokens (depth and tree size)."""
    update = {"draft_tokens": min(block.draft_tokens, tokens)}
    if block.kind != "engine":
        update["max_tree_tokens"] = min(block.max_tree_tokens, tokens)
    if block.kind == "ngram":
        update["branch_tokens"] = min(block.branch_tokens, tokens)
    return block.model_copy(update=update)


def describe(config: Config) -> str:
    """One line for people: ``ngram match 1-3, 8 deep, 3 candidates (2 deep), ...``."""
    if isinstance(config, EngineLookupConfig):
        match = (
            f"exactly {config.max_match}"
            if config.min_match == config.max_match
            else f"{config.min_match}-{config.max_match}"
        )
        return (
            f"{config.engine} prompt lookup: match {match}, {config.draft_tokens} tokens, "
            f"{config.prefer} occurrence"
        )
    if isinstance(config, LookupConfig):
        return (
            f"ngram match {config.min_match}-{config.max_match}, {config.draft_tokens} deep, "
            f"{config.candidates} candidates ({config.branch_tokens} deep), <= "
            f"{config.max_tree_tokens} nodes, {config.prefer} occurrence first"
        )
    return (
        f"suffix match {config.min_match}-{config.max_match}, {config.draft_tokens} deep, "
        f"{config.tokens_per_match} tokens per matched token, p >= {config.min_probability}, "
        f"<= {config.max_tree_tokens} nodes"
    )


class NgramSettings(MethodSettings):
    draft: LookupBlock  # the setting for every prompt
    # workload categories whose own setting measured clearly faster on their search prompts
    by_category: dict[str, LookupBlock] = Field(default_factory=dict)
    # the best setting of each kind and its search-prompt speedup (the faster is `draft`)
    alternatives: dict = Field(default_factory=dict)

    def config(self) -> Config:
        return config_of(self.draft)

    def draft_size(self) -> int:
        """The most tokens one draft holds, over every category's setting."""
        return max(draft_size(b) for b in [self.draft, *self.by_category.values()])

    def capped(self, tokens: int) -> NgramSettings:
        """Every setting with at most ``tokens`` draft tokens."""
        return self.model_copy(
            update={
                "draft": capped(self.draft, tokens),
                "by_category": {c: capped(b, tokens) for c, b in self.by_category.items()},
            }
        )

    def category_configs(self) -> dict[str, Config]:
        return {name: config_of(block) for name, block in self.by_category.items()}
