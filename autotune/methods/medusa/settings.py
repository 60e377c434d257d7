"""The Medusa block of a profile, and its conversion to the drafter's tree."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from autotune.engine.tree import smaller_tree
from autotune.profile.blocks import Block, MethodSettings, canonical_tree


class TypicalSettings(Block):
    """Medusa's typical acceptance for sampling: accept when p > min(eps, delta*exp(-H))."""

    eps: float = Field(gt=0.0, le=1.0)
    delta: float = Field(gt=0.0)
    temperature: float = Field(gt=0.0)
    min_fidelity: float = Field(ge=0.0, le=1.0)
    sweep: list[dict] = Field(default_factory=list)


class MedusaAcceptance(Block):
    greedy: Literal["exact"] = "exact"
    typical: TypicalSettings | None = None


class MedusaSettings(MethodSettings):
    heads: str  # the head folder (upstream Medusa layout)
    num_heads: int = Field(ge=1)  # heads evaluated: the tree's depth
    tree: list[list[int]]  # Medusa / TensorRT-LLM choices, canonical order
    acceptance: MedusaAcceptance = MedusaAcceptance()

    @field_validator("tree")
    @classmethod
    def _tree_is_a_tree(cls, tree):
        return canonical_tree(tree)

    @model_validator(mode="after")
    def _depth_within_heads(self):
        depth = max(len(p) for p in self.tree)
        if depth > self.num_heads:
            raise ValueError(f"tree depth {depth} exceeds num_heads {self.num_heads}")
        return self

    def choices(self) -> list[tuple[int, ...]]:
        return [tuple(p) for p in self.tree]

    def draft_size(self) -> int:
        return len(self.tree)

    def capped(self, tokens: int) -> MedusaSettings:
        """The tree's ``tokens`` likeliest paths, and only the heads they reach."""
        tree = smaller_tree(self.tree, tokens)
        return self.model_copy(
            update={"tree": [list(p) for p in tree], "num_heads": max(len(p) for p in tree)}
        )
