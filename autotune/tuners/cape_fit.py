"""Fit CAPE for one chain drafter: which confidence bins, and how many tokens each step in
a bin proposes, by replaying the drafter's decoding on calibration continuations with
this device's measured costs. Pure functions: no model calls.

The replay is exact for greedy decoding up to two approximations: the drafter's steps are
those it drafts when the steps before were right (a step after a wrong one cannot be
accepted, but its confidence still sets its cost), and time is the measured cost of the
drafting and of verifying a tree of that size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from autotune.drafters.cape import NO_EXPANSION, CapePolicy
from autotune.drafters.self_spec import DraftExitPolicy, ExitThreshold
from autotune.engine.decoding import tokens_per_step
from autotune.measure.cape_stats import ChainSteps
from autotune.measure.costs import LatencyCurve

# --- how each drafter's chain grows ---------------------------------------------------


class ChainRule(Protocol):
    """How a chain drafter decides its length, and what drafting it costs."""

    def start(self) -> Any: ...

    def draft(
        self, state: Any, confidences: list[float], remaining: int
    ) -> tuple[int, float, bool]:
        """(tokens drafted, seconds, whether the length limit was hit)."""

    def observe(self, state: Any, drafted: int, accepted: int, hit_max: bool) -> None: ...


@dataclass(frozen=True)
class SelfSpecChain:
    """The layer-skip chain: up to max_tokens, ending before the first later step whose
    confidence is below the exit threshold (that step's forward is spent); the threshold
    moves after each verification as the drafter's policy says."""

    policy: DraftExitPolicy
    forward_seconds: float  # one draft forward

    def start(self) -> ExitThreshold:
        return ExitThreshold(self.policy)

    def draft(self, state: ExitThreshold, confidences: list[float], remaining: int):
        limit = max(1, min(self.policy.max_tokens, remaining - 1))
        drafted = forwards = 1
        while drafted < limit:
            forwards += 1
            if confidences[drafted] < state.value:
                break
            drafted += 1
        return drafted, forwards * self.forward_seconds, drafted == limit

    def observe(self, state: ExitThreshold, drafted: int, accepted: int, hit_max: bool):
        state.update(drafted, accepted, hit_max)


@dataclass(frozen=True)
class FixedChain:
    """A chain of fixed depth (EAGLE's head drafting a chain)."""

    depth: int
    seconds: float  # drafting the whole chain

    def start(self):
        return None

    def draft(self, state, confidences: list[float], remaining: int):
        return min(self.depth, max(1, remaining - 1)), self.seconds, True

    def observe(self, state, drafted: int, accepted: int, hit_max: bool):
        pass


# --- replay -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CapeEstimate:
    speedup: float  # over plain greedy decoding (one forward a token)
    tokens_per_step: float
    verified_per_step: float  # tree size, root included


def replay(
    chains: list[ChainSteps], chain: ChainRule, policy: CapePolicy, verify: LatencyCurve
) -> CapeEstimate:
    """Decode every calibration continuation again on paper: each step drafts the chain,
    adds each step's siblings within the budget (earlier steps first, as the drafter
    does), accepts the chain's right prefix plus a sibling holding the target's token at
    the first wrong step, and costs the drafting plus verifying the tree."""
    edges = np.asarray(policy.edges)
    sizes = np.asarray(policy.expansion)
    tokens = steps = verified = 0
    seconds = 0.0
    for c in chains:
        bins = np.minimum(np.searchsorted(edges, c.confidences, side="left"), len(edges) - 1)
        extra = (sizes[bins] - 1).tolist()
        confidences, ranks = c.confidences.tolist(), c.ranks.tolist()
        # the prefill gives continuation[0]; drafting starts from the next root
        state, t, total = chain.start(), 1, c.roots
        while t < total:
            drafted, draft_seconds, hit_max = chain.draft(state, confidences[t], total - t)
            budget = policy.max_verify_tokens - 1 - drafted
            granted = []
            for j in range(drafted):
                granted.append(min(extra[t][j], budget))
                budget -= granted[-1]
            right = 0
            while right < drafted and ranks[t][right] == 0:
                right += 1
            accepted = right + (right < drafted and 0 < ranks[t][right] <= granted[right])
            produced = min(accepted + 1, total - t)
            nodes = 1 + drafted + sum(granted)
            tokens, steps, verified = tokens + produced, steps + 1, verified + nodes
            seconds += draft_seconds + verify(nodes)
            chain.observe(state, drafted, right, hit_max)
            t += produced
    # the prefill's token is not replayed: every token counted came from a step
    return CapeEstimate(
        tokens * verify(1) / max(seconds, 1e-12),
        tokens_per_step(tokens, steps, sequences=0),
        verified / max(steps, 1),
    )


# --- the fit ----------------------------------------------------------------------------


def policy_of(sizes: list[int], max_verify_tokens: int) -> CapePolicy:
    """Per fine bin sizes -> a policy whose bins merge neighbours of equal size."""
    fine = len(sizes)
    edges: list[float] = []
    expansion: list[int] = []
    for b, size in enumerate(sizes):
        if expansion and expansion[-1] == size:
            edges[-1] = (b + 1) / fine
        else:
            edges.append((b + 1) / fine)
            expansion.append(size)
    edges[-1] = 1.0
    return CapePolicy(tuple(round(e, 6) for e in edges), tuple(expansion), max_verify_tokens)


def _monotone(sizes: list[int], b: int, k: int) -> list[int]:
    """Bin b set to k; bins of lower confidence keep at least k, higher at most k (a less
    sure draft never expands less: a prior that keeps the fit from chasing noise)."""
    return [max(s, k) if i < b else k if i == b else min(s, k) for i, s in enumerate(sizes)]


@dataclass(frozen=True)
class FitSettings:
    fine_bins: int  # confidence resolution: edges fall on multiples of 1/fine_bins
    max_expansion: int  # tokens proposed at one step, the chain's included
    max_verify_tokens: int  # verified tree size, root included
    min_gain: float  # a move must raise the predicted speedup this much (relative)


@dataclass
class CapeFit:
    policy: CapePolicy
    predicted: CapeEstimate
    no_expansion: CapeEstimate
    replays: int


@dataclass
class ChainModel:
    """One chain configuration of a drafter, as the fit replays it: how the chain grows
    and what it costs (``rule``), its measured steps along calibration decoding, and the
    setting that gives this configuration (``chain_depth`` for a tree method's chain)."""

    label: str
    rule: ChainRule
    steps: list[ChainSteps]
    chain_depth: int | None = None
    info: dict = field(default_factory=dict)


def fit_expansion(
    chains: list[ChainSteps], chain: ChainRule, verify: LatencyCurve, space: FitSettings
) -> CapeFit:
    """Coordinate ascent over one size per fine bin, from no expansion, each move a
    monotone change; a move must raise the predicted speedup by ``min_gain``."""
    budget = space.max_verify_tokens
    sizes = [1] * space.fine_bins
    start = best = replay(chains, chain, policy_of(sizes, budget), verify)
    replays, improved = 1, True
    while improved:
        improved = False
        for b in range(space.fine_bins):
            for k in range(1, space.max_expansion + 1):
                candidate = _monotone(sizes, b, k)
                if candidate == sizes:
                    continue
                estimate = replay(chains, chain, policy_of(candidate, budget), verify)
                replays += 1
                if estimate.speedup > best.speedup * (1 + space.min_gain):
                    sizes, best, improved = candidate, estimate, True
    return CapeFit(policy_of(sizes, budget), best, start, replays)


def fit_best(
    models: list[ChainModel], verify: LatencyCurve, space: FitSettings, finalists: int = 2
) -> tuple[ChainModel, CapeFit, dict[str, float]]:
    """The chain configuration and expansion predicted fastest: every configuration is
    replayed without expansion, and expansion is fitted on the ``finalists`` best (it
    rarely moves the order further). Also returns the no-expansion prediction of each."""
    plain = {m.label: replay(m.steps, m.rule, NO_EXPANSION, verify).speedup for m in models}
    best_first = sorted(models, key=lambda m: plain[m.label], reverse=True)[:finalists]
    fits = [(m, fit_expansion(m.steps, m.rule, verify, space)) for m in best_first]
    model, fit = max(fits, key=lambda pair: pair[1].predicted.speedup)
    return model, fit, plain
