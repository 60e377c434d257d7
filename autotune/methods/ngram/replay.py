"""The proxy the n-gram search is steered by: drafting replayed along the target's own
greedy continuations, costed with this device's verify-latency curve.

For greedy decoding the replay is exact: a draft depends only on the tokens so far, the
target's answer is its greedy continuation, and so the accepted path of every step, the
number of steps and each step's tree size are what real decoding would give (a test
checks it against ``decode_speculative``). Only the time is a model: a step costs one
verification of its tree (the curve) plus the measured cost of drafting; plain decoding
one single-token forward per token. The prefill, the same for both, is left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from autotune.drafters.ngram import NgramDrafter
from autotune.engine.proposal import Draft
from autotune.measure.costs import LatencyCurve
from autotune.methods.ngram.settings import Config


@dataclass(frozen=True)
class Continuation:
    """A prompt, the target's greedy continuation of it (``max_new_tokens`` long unless
    it ended early), and the prompt's workload category."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    max_new_tokens: int
    category: str | None = None


def accepted_along(draft: Draft, wanted: Sequence[int]) -> int:
    """How many of ``wanted`` the target accepts from ``draft``: the longest path from the
    root whose tokens are ``wanted``'s first ones."""
    children = draft.shape.children
    node, accepted = -1, 0
    for token in wanted:
        node = next((c for c in children[node + 1] if draft.tokens[c] == token), -2)
        if node == -2:
            break
        accepted += 1
    return accepted


def replay(drafter: NgramDrafter, sequence: Continuation) -> list[int]:
    """The tree size of every verification when ``drafter`` decodes ``sequence``'s prompt
    greedily (as ``decode_speculative`` does, step for step)."""
    drafter.reset()
    prompt, target = list(sequence.prompt), sequence.tokens
    emitted, sizes = 1, []  # the prefill emits the first token
    while emitted < len(target):
        history = prompt + list(target[:emitted])
        draft = drafter.draft_for(history, sequence.max_new_tokens - emitted)
        emitted += accepted_along(draft, target[emitted:]) + 1
        sizes.append(len(draft.tokens))
    return sizes


@dataclass(frozen=True)
class Costs:
    """What a step costs: one verification of the root and ``n`` draft tokens (the
    curve's ``n + 1``), plus drafting."""

    curve: LatencyCurve
    draft_seconds: float

    def speculative(self, sizes: Iterable[int]) -> float:
        return sum(self.curve(n + 1) + self.draft_seconds for n in sizes)

    def plain(self, tokens: int) -> float:
        return max(tokens - 1, 0) * self.curve(1)


class Replayer:
    """Predicted speedups of drafter settings on a fixed set of continuations; each
    (setting, continuation) pair is replayed once and kept."""

    def __init__(self, sequences: Sequence[Continuation], costs: Callable[[Config], Costs]):
        self.sequences = list(sequences)
        self.costs = costs
        self._sizes: dict[tuple[Config, int], list[int]] = {}

    def indices(self, category: str | None = None) -> list[int]:
        """The continuations of ``category`` (all of them for None)."""
        return [
            i for i, s in enumerate(self.sequences) if category is None or s.category == category
        ]

    def categories(self) -> list[str]:
        return sorted({s.category for s in self.sequences if s.category is not None})

    def sizes(self, config: Config, index: int) -> list[int]:
        key = (config, index)
        if key not in self._sizes:
            self._sizes[key] = replay(NgramDrafter(config), self.sequences[index])
        return self._sizes[key]

    def speedup(self, config: Config, indices: Sequence[int]) -> float:
        """Plain decoding's predicted seconds over the setting's, all ``indices`` together."""
        costs = self.costs(config)
        plain = sum(costs.plain(len(self.sequences[i].tokens)) for i in indices)
        spec = sum(costs.speculative(self.sizes(config, i)) for i in indices)
        return plain / spec if spec > 0 else 1.0

    def tokens_per_step(self, config: Config, indices: Sequence[int]) -> float:
        tokens = sum(len(self.sequences[i].tokens) - 1 for i in indices)
        steps = sum(len(self.sizes(config, i)) for i in indices)
        return tokens / steps if steps else 1.0


def time_drafting(config: Config, sequences: Sequence[Continuation]) -> float:
    """Seconds one proposal of ``config`` takes on this machine (mean over a replay)."""
    drafter = NgramDrafter(config)
    proposals, start = 0, time.perf_counter()
    for sequence in sequences:
        proposals += len(replay(drafter, sequence))
    return (time.perf_counter() - start) / max(proposals, 1)
