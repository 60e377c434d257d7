"""The interface every drafter implements, and the values it exchanges with the decoder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from autotune.engine.kvcache import KVCache
from autotune.engine.runner import Runner
from autotune.engine.sampling import SamplingConfig
from autotune.engine.tree import TreeShape


@dataclass
class DraftContext:
    """What a drafter may look at: the committed cache and the token that follows it."""

    runner: Runner
    cache: KVCache
    last_token: int         # not yet in the cache
    position: int           # its position (= committed cache length)
    max_tokens: int         # the decoder's remaining budget for this step
    sampling: SamplingConfig
    generator: torch.Generator
    # The target's hidden states (before its final norm) at the positions committed since
    # the last proposal: the whole prompt first, then the root and the accepted path.
    # The last row is the one whose logits gave ``last_token``.
    hidden: torch.Tensor | None = None
    # Logits a drafter asked the target's verify forward to compute for it (see
    # ``Drafter.extra_rows``), at the position of the last row of ``hidden``.
    extra_logits: torch.Tensor | None = None
    # The tokens at the positions of ``hidden``'s rows (the prompt, then the root and the
    # accepted path): with ``last_token`` they give each row's next token.
    tokens: list[int] | None = None


@dataclass
class Draft:
    """Drafted tokens: a chain, or a tree when ``tree`` is given (node i is tokens[i]).

    ``draft_probs`` [k, V]: the distributions the tokens were drawn from, when sampling;
    None for a tree whose tokens were chosen deterministically (top-k).
    """

    tokens: list[int]
    draft_probs: torch.Tensor | None = None
    tree: TreeShape | None = None
    # For a chain, when the drafter was asked for them (``ranked_width``): per step the
    # draft's most likely tokens [k, width] and their probabilities [k, width], best first
    # (what confidence-aware expansion reads).
    ranked_tokens: torch.Tensor | None = None
    ranked_probs: torch.Tensor | None = None


@dataclass
class VerifyResult:
    num_drafted: int
    num_accepted: int
    path: list[int] | None = None   # accepted node indices, for trees


class Drafter(Protocol):
    def reset(self) -> None:
        """Start a new sequence (drop adaptive state)."""

    def propose(self, context: DraftContext) -> Draft:
        """Propose at least one token; may write to the cache past ``context.position``
        (the decoder crops it before verifying)."""

    def observe(self, result: VerifyResult) -> None:
        """Learn from the verification of the last proposal."""

    # Optional: ``extra_rows(runner)`` returns None, or a function from the target's
    # final-normed hidden states [S, H] to rows [k * S, H] (k blocks of S) that the verify
    # forward sends through the target's lm_head; the next DraftContext carries their
    # logits [k, V] at the last accepted position as ``extra_logits``.
