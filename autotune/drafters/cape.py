"""CAPE (confidence-aware proposal expansion, from GLIDE): an autoregressive drafter's
chain, plus at each step k - 1 runner-up tokens as siblings of the chain token when the
draft was unsure there. The bin of the step's top-1 probability gives k. Siblings are
not extended; chain and siblings are verified as one tree, within a verify-token budget.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import cast

from autotune.engine.proposal import ChainDrafter, Draft, DraftContext, Drafter, VerifyResult
from autotune.engine.tree import ROOT, TreeShape


@dataclass(frozen=True)
class CapePolicy:
    """Confidence p falls in bin i when edges[i - 1] < p <= edges[i] (edges ascending,
    the last 1.0); that step proposes expansion[i] tokens, the chain's included."""

    edges: tuple[float, ...]
    expansion: tuple[int, ...]
    max_verify_tokens: int = 32

    def __post_init__(self):
        if len(self.edges) != len(self.expansion) or not self.edges:
            raise ValueError("CAPE needs one expansion size per confidence bin")
        if list(self.edges) != sorted(self.edges) or self.edges[-1] != 1.0:
            raise ValueError(f"bin edges must ascend to 1.0, got {list(self.edges)}")
        if min(self.expansion) < 1 or self.max_verify_tokens < 2:
            raise ValueError("expansion sizes must be >= 1 and max_verify_tokens >= 2")

    def describe(self) -> str:
        """For people: "<= 0.5: 3, <= 1: 1" (tokens per step by confidence)."""
        return ", ".join(f"<= {e:g}: {k}" for e, k in zip(self.edges, self.expansion))

    def tokens_at(self, confidence: float) -> int:
        return self.expansion[min(bisect.bisect_left(self.edges, confidence), len(self.edges) - 1)]


NO_EXPANSION = CapePolicy((1.0,), (1,))
PAPER_7531 = CapePolicy((0.3, 0.6, 0.8, 1.0), (7, 5, 3, 1))  # GLIDE's paper
# GLIDE's code: k = table[floor(10 p)] with table 8 8 8 6 6 6 4 4 2 2 2 (2); its bins
# close on the left, [0.3, 0.6) ..., ours on the right: they differ only at p exactly on
# an edge.
CODE_FLOOR10 = CapePolicy((0.3, 0.6, 0.8, 1.0), (8, 6, 4, 2))
PUBLISHED = {"paper_7531": PAPER_7531, "code_floor10": CODE_FLOOR10}


class CapeDrafter(Drafter):
    """Wraps a chain drafter built to report each step's ranked tokens, at least as many as
    the widest bin proposes (``ranked_width``): the layer-skip drafter, the EAGLE drafter
    with a chain, the GLIDE drafter."""

    def __init__(self, base: ChainDrafter, policy: CapePolicy):
        if base.ranked_width < max(policy.expansion):
            raise ValueError(
                f"CAPE proposes up to {max(policy.expansion)} tokens a step: "
                f"build the chain drafter with ranked_width >= that "
                f"(it has {base.ranked_width})"
            )
        self.base, self.policy = base, policy
        self.max_draft_tokens = policy.max_verify_tokens - 1
        self._chain_nodes: list[int] = []

    def reset(self) -> None:
        self.base.reset()

    def propose(self, context: DraftContext) -> Draft:
        return self._expand(self.base.propose(context))

    @classmethod
    def propose_all(cls, drafters: list[Drafter], contexts: list[DraftContext]) -> list[Draft]:
        """The base drafters propose together, as their kind batches it; each chain is
        then expanded by its own policy."""
        capes = cast(list[CapeDrafter], drafters)  # ``propose_all`` is called per kind
        drafts: list[Draft | None] = [None] * len(capes)
        kinds: dict[type[Drafter], list[int]] = {}
        for index, cape in enumerate(capes):
            kinds.setdefault(type(cape.base), []).append(index)
        for kind, indices in kinds.items():
            chains = kind.propose_all(
                [capes[i].base for i in indices], [contexts[i] for i in indices]
            )
            for index, chain in zip(indices, chains):
                drafts[index] = capes[index]._expand(chain)
        return cast(list[Draft], drafts)

    def _expand(self, draft: Draft) -> Draft:
        """The chain with each step's alternatives as siblings, as many as its bin asks."""
        ranked_tokens, ranked_probs = draft.ranked_tokens, draft.ranked_probs
        if ranked_tokens is None or ranked_probs is None or not draft.shape.is_chain:
            raise ValueError("CAPE expands a chain drafter that reports its ranked tokens")
        budget = self.policy.max_verify_tokens - 1  # the root is verified too
        chain = draft.tokens[:budget]
        siblings = budget - len(chain)
        tokens: list[int] = []
        parents: list[int] = []
        self._chain_nodes = []
        for step, token in enumerate(chain):
            parent = self._chain_nodes[-1] if self._chain_nodes else ROOT
            self._chain_nodes.append(len(tokens))
            tokens.append(token)
            parents.append(parent)
            wanted = self.policy.tokens_at(float(ranked_probs[step, 0])) - 1
            for alternative in ranked_tokens[step].tolist():
                if wanted <= 0 or siblings <= 0:  # earlier steps get the budget first
                    break
                if alternative == token:
                    continue
                tokens.append(alternative)
                parents.append(parent)
                wanted, siblings = wanted - 1, siblings - 1
        # parents come before children: chain node i precedes everything at depth i + 1
        return Draft(tokens, tree=TreeShape(tuple(parents)))

    def observe(self, result: VerifyResult) -> None:
        """The base drafter learns how far its own chain was accepted."""
        accepted = 0
        for node in result.path:
            if accepted < len(self._chain_nodes) and node == self._chain_nodes[accepted]:
                accepted += 1
            else:
                break
        self.base.observe(VerifyResult(len(self._chain_nodes), accepted))
