"""The contract between the decoder and a drafter, and the values they exchange.

Words used here: a *draft* is the tokens a drafter proposes for one step, a chain or a
tree below the *root* (the last committed token, verified with them). The decoder
verifies the whole draft in one target forward and keeps the *accepted* path plus the
target's own *bonus* token (see ``engine.verify``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from autotune.engine.kvcache import KVCache
from autotune.engine.sampling import SamplingConfig
from autotune.engine.tree import TreeShape

if TYPE_CHECKING:
    from autotune.engine.runner import ExtraRows, Runner


@dataclass
class DraftContext:
    """What a drafter may look at: the committed cache and the token that follows it."""

    runner: Runner
    cache: KVCache
    last_token: int  # the root: not yet in the cache
    position: int  # its position (= committed cache length)
    max_tokens: int  # tokens the decoder may still emit, the bonus included
    sampling: SamplingConfig
    generator: torch.Generator
    # The target's hidden states (before its final norm) at the positions committed since
    # the last proposal: the whole prompt first, then the root and the accepted path.
    # The last row is the one whose logits gave ``last_token``.
    hidden: torch.Tensor | None = None
    # Logits the drafter asked the verify forward to compute for it (``Drafter.extra_rows``),
    # at the position of the last row of ``hidden``.
    extra_logits: torch.Tensor | None = None
    # The tokens at the positions of ``hidden``'s rows (the prompt, then the root and the
    # accepted path): with ``last_token`` they give each row's next token.
    tokens: list[int] | None = None
    # Every token so far, prompt and output, ending with ``last_token``.
    history: list[int] = field(default_factory=list)


@dataclass
class Draft:
    """Drafted tokens: a chain, or a tree when ``tree`` is given (node i is tokens[i]).

    ``draft_probs`` [k, V]: the distributions the tokens were drawn from, when sampling;
    None for tokens chosen deterministically (top-k). For a chain drafted with
    ``ranked_width`` > 0: per step the draft's most likely tokens [k, width] and their
    probabilities [k, width], best first (what confidence-aware expansion reads).
    """

    tokens: list[int]
    draft_probs: torch.Tensor | None = None
    tree: TreeShape | None = None
    ranked_tokens: torch.Tensor | None = None
    ranked_probs: torch.Tensor | None = None

    @property
    def shape(self) -> TreeShape:
        return self.tree if self.tree is not None else TreeShape.chain(len(self.tokens))


@dataclass(frozen=True)
class VerifyResult:
    num_drafted: int
    num_accepted: int
    path: tuple[int, ...] = ()  # accepted node indices, root first


class Drafter(ABC):
    """Proposes draft tokens and learns from their verification.

    The contract (``tests/test_drafter_contract.py`` runs every drafter through it):
    - ``propose`` returns at least one token, as a chain or a valid tree (parents before
      children), no larger than ``max_draft_tokens``; a drafter with ``may_skip`` may
      return none (a plain step, as the engines' prompt lookup does without a match);
      it may write to the target's cache
      past ``context.position`` (the decoder crops it before verifying);
    - greedy decoding with any drafter equals plain greedy decoding token for token;
    - ``observe`` is told how far each proposal was accepted; ``reset`` starts a new
      sequence (a drafter is reused across prompts).
    """

    # The most draft tokens one proposal may hold (the root not counted).
    max_draft_tokens: int = 256
    # Whether a proposal may hold no token at all.
    may_skip: bool = False

    @abstractmethod
    def propose(self, context: DraftContext) -> Draft:
        """Propose at least one token (none only where ``may_skip``)."""

    @classmethod
    def propose_all(cls, drafters: list[Drafter], contexts: list[DraftContext]) -> list[Draft]:
        """The proposals of several sequences decoded together (``engine.batched``), each
        drafter of this class for its own context: a kind whose drafting runs forwards
        may batch them here. By default one proposal after another."""
        return [drafter.propose(context) for drafter, context in zip(drafters, contexts)]

    def reset(self) -> None:  # noqa: B027  (optional: most drafters keep no state)
        """Start a new sequence: drop adaptive state."""

    def observe(self, result: VerifyResult) -> None:  # noqa: B027  (optional, as reset)
        """Learn from the verification of the last proposal."""

    def extra_rows(self, runner: Runner) -> ExtraRows | None:
        """None, or a function from the target's final-normed hidden states [S, H] to rows
        [k * S, H] (k blocks of S) that the verify forward sends through the target's
        lm_head; the next context carries their logits [k, V] at the last accepted
        position as ``extra_logits``."""
        return None


class ChainDrafter(Drafter):
    """A drafter that drafts a chain, one token a step, and can report each step's ranked
    tokens (``ranked_width`` of them): what CAPE expands."""

    ranked_width: int = 0
