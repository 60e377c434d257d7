"""The EAGLE block of a profile, and its conversion to the drafter's tree."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from autotune.drafters.eagle import DynamicTree, StaticTree
from autotune.engine.tree import smaller_tree
from autotune.methods.cape.settings import CapeSettings
from autotune.profile.blocks import Block, MethodSettings, canonical_tree


class StaticEagleTree(Block):
    kind: Literal["static"] = "static"
    choices: list[list[int]]  # paths of ranks, one rank per drafting step

    @field_validator("choices")
    @classmethod
    def _tree_is_a_tree(cls, choices):
        return canonical_tree(choices)


class DynamicEagleTree(Block):
    """EAGLE-2's expansion: verified tokens (root included), expansions, children."""

    kind: Literal["dynamic"] = "dynamic"
    total_tokens: int = Field(ge=2)
    depth: int = Field(ge=0)
    top_k: int = Field(ge=1)


TreeBlock = StaticEagleTree | DynamicEagleTree


def tree_block(tree: StaticTree | DynamicTree) -> TreeBlock:
    if isinstance(tree, StaticTree):
        return StaticEagleTree(choices=[list(p) for p in tree.choices])
    return DynamicEagleTree(total_tokens=tree.total_tokens, depth=tree.depth, top_k=tree.top_k)


def drafting_tree(block: TreeBlock) -> StaticTree | DynamicTree:
    if isinstance(block, StaticEagleTree):
        return StaticTree(tuple(tuple(p) for p in block.choices))
    return DynamicTree(block.total_tokens, block.depth, block.top_k)


class EagleSettings(MethodSettings):
    head: str  # the head folder (upstream EAGLE-1/2 layout)
    tree: TreeBlock = Field(discriminator="kind")
    # the draft's lm_head covers the head folder's N most frequent tokens (0: all of them)
    draft_vocab: int = Field(0, ge=0)
    cape: CapeSettings | None = None
    # both tree kinds' winners and their search-split measurements (the faster is `tree`)
    alternatives: dict = Field(default_factory=dict)

    def drafting_tree(self) -> StaticTree | DynamicTree:
        return drafting_tree(self.tree)

    def draft_size(self) -> int:
        """The most tokens one draft holds."""
        if self.cape is not None and self.cape.enabled:
            return self.cape.draft_size(self.cape.chain_depth or 1)
        if isinstance(self.tree, StaticEagleTree):
            return len(self.tree.choices)
        return self.tree.total_tokens - 1

    def capped(self, tokens: int) -> EagleSettings:
        """At most ``tokens`` draft tokens: the likeliest paths of a static tree, a smaller
        dynamic one, a smaller CAPE expansion."""
        tree = self.tree
        if isinstance(tree, StaticEagleTree):
            smaller: TreeBlock = StaticEagleTree(
                choices=[list(p) for p in smaller_tree(tree.choices, tokens)]
            )
        else:
            smaller = DynamicEagleTree(
                total_tokens=min(tree.total_tokens, tokens + 1),
                depth=min(tree.depth, tokens - 1),
                top_k=min(tree.top_k, tokens),
            )
        cape = None if self.cape is None else self.cape.capped(tokens)
        return self.model_copy(update={"tree": smaller, "cape": cape})
