"""The interface every drafter implements, and the values it exchanges with the decoder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from autotune.engine.kvcache import KVCache
from autotune.engine.runner import Runner
from autotune.engine.sampling import SamplingConfig


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


@dataclass
class Draft:
    """A drafted chain; ``draft_probs`` [k, V] only when sampling."""

    tokens: list[int]
    draft_probs: torch.Tensor | None = None


@dataclass
class VerifyResult:
    num_drafted: int
    num_accepted: int


class Drafter(Protocol):
    def reset(self) -> None:
        """Start a new sequence (drop adaptive state)."""

    def propose(self, context: DraftContext) -> Draft:
        """Propose at least one token; may write to the cache past ``context.position``
        (the decoder crops it before verifying)."""

    def observe(self, result: VerifyResult) -> None:
        """Learn from the verification of the last proposal."""
