"""Medusa drafting: the heads read the target's last hidden state and their top-k tokens
fill a fixed tree, verified in one target forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autotune.engine.proposal import Draft, DraftContext, Drafter
from autotune.engine.tree import TreeShape, check_tree
from autotune.errors import AutotuneError
from autotune.heads.medusa import MedusaHeads


class TreeTooDeepError(AutotuneError):
    pass


@dataclass(frozen=True)
class HeadFeatures:
    """The first ``depth`` heads' features of the final-normed rows [S, H], as blocks of
    S rows per head ([depth * S, H]), for the lm_head to turn into logits. Equal (and
    hashed alike) when the heads are the same object at the same depth: a GPU runner
    records the verify step that computes them once, not once per decoding
    (``engine.static.Variant``)."""

    heads: MedusaHeads
    depth: int

    def __call__(self, normed: torch.Tensor) -> torch.Tensor:
        return self.heads.features(normed, self.depth).flatten(0, 1)


class MedusaDrafter(Drafter):
    """Node ``[r0, ..., rd]`` of the tree holds head d's rank-rd token. Only the heads
    the tree reaches are evaluated, so the tree's depth is the head count used."""

    def __init__(self, heads: MedusaHeads, choices, fused: bool = True):
        try:
            self.paths = check_tree(choices, heads.num_heads)
        except ValueError as exc:
            raise TreeTooDeepError(f"Medusa tree: {exc}") from None
        self.heads, self.fused = heads, fused
        self.tree = TreeShape.from_choices(self.paths)
        self.depth = max(len(p) for p in self.paths)
        self.top_k = 1 + max(r for p in self.paths for r in p)
        self.max_draft_tokens = len(self.paths)
        # (head, rank) of every node, as index tensors into the heads' top-k table
        self._head = torch.tensor([len(p) - 1 for p in self.paths])
        self._rank = torch.tensor([p[-1] for p in self.paths])

    def extra_rows(self, runner):
        """Heads that share the target's lm_head have their logits computed in the verify
        forward's own lm_head product, for every verified position (as upstream Medusa
        does); the next proposal reads the accepted position's."""
        weights = self.heads.vocab_weights()
        if not (self.fused and all(w is runner.lm_head.weight for w in weights)):
            return None
        return HeadFeatures(self.heads, self.depth)

    def propose(self, context: DraftContext) -> Draft:
        runner = context.runner
        with torch.inference_mode():
            if context.extra_logits is not None:
                logits = context.extra_logits  # [depth, V]
            else:
                if context.hidden is None:
                    raise ValueError("Medusa drafting needs the target's hidden states")
                hidden = runner.norm(context.hidden[-1:])  # [1, H], after the final norm
                logits = self.heads(hidden, self.depth)[:, 0]  # [depth, V]
            top = logits.topk(self.top_k, dim=-1).indices  # [depth, top_k]
        tokens = top[self._head, self._rank].tolist()
        return Draft(tokens, tree=self.tree)
