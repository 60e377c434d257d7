"""Fit CAPE for one chain drafter: which confidence bins, and how many tokens each step in
a bin proposes, by replaying the drafter's decoding on calibration continuations with
this device's measured costs; then confirm the fit by wall clock on held-back prompts.

The replay is exact for greedy decoding up to two approximations: the drafter's steps are
those it drafts when the steps before were right (a step after a wrong one cannot be
accepted, but its confidence still sets its cost), and time is the measured cost of the
drafting and of verifying a tree of that size.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from autotune.drafters.cape import NO_EXPANSION, CapeDrafter, CapePolicy
from autotune.drafters.self_spec import DraftExitPolicy, ExitThreshold, LayerSkipDrafter
from autotune.measure.cape_stats import ChainSteps
from autotune.measure.costs import LatencyCurve
from autotune.measure.timing import Measurement, measure_with_progress
from autotune.progress import say, step
from autotune.prompts import split_prompts
from autotune.tuners.space import CapeSpace
from autotune.workspace import Workspace


# --- how each drafter's chain grows ---------------------------------------------------

@dataclass(frozen=True)
class SelfSpecChain:
    """The layer-skip chain: up to max_tokens, ending before the first later step whose
    confidence is below the exit threshold (that step's forward is spent); the threshold
    moves after each verification as the drafter's policy says."""

    policy: DraftExitPolicy
    forward_seconds: float          # one draft forward

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
    seconds: float                  # drafting the whole chain

    def start(self):
        return None

    def draft(self, state, confidences: list[float], remaining: int):
        return min(self.depth, max(1, remaining - 1)), self.seconds, True

    def observe(self, state, drafted: int, accepted: int, hit_max: bool):
        pass


# --- replay -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CapeEstimate:
    speedup: float                  # over plain greedy decoding (one forward a token)
    tokens_per_step: float
    verified_per_step: float        # tree size, root included


def replay(chains: list[ChainSteps], chain, policy: CapePolicy,
           verify: LatencyCurve) -> CapeEstimate:
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
    return CapeEstimate(tokens * verify(1) / max(seconds, 1e-12), tokens / max(steps, 1),
                        verified / max(steps, 1))


# --- the fit ----------------------------------------------------------------------------

def policy_of(sizes: list[int], max_verify_tokens: int) -> CapePolicy:
    """Per fine bin sizes -> a policy whose bins merge neighbours of equal size."""
    fine = len(sizes)
    edges, expansion = [], []
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


@dataclass
class CapeFit:
    policy: CapePolicy
    predicted: CapeEstimate
    no_expansion: CapeEstimate
    replays: int


def fit_expansion(chains: list[ChainSteps], chain, verify: LatencyCurve,
                  space: CapeSpace) -> CapeFit:
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


# --- the two drafters -------------------------------------------------------------------

@dataclass
class CapeResult:
    policy: CapePolicy
    chain_depth: int | None         # EAGLE's chain; None for the self-spec chain
    measured: Measurement           # held-back, the drafter with this expansion
    predicted: CapeEstimate
    search: dict = field(default_factory=dict)


def _search_info(fit: CapeFit, started: float, **extra) -> dict:
    return {"predicted_no_expansion": round(fit.no_expansion.speedup, 4),
            "predicted": round(fit.predicted.speedup, 4),
            "predicted_tokens_per_step": round(fit.predicted.tokens_per_step, 3),
            "predicted_verified_per_step": round(fit.predicted.verified_per_step, 2),
            "replays": fit.replays, **extra, "seconds": round(time.monotonic() - started, 1)}


def _announce(fit: CapeFit, what: str) -> None:
    say(f"cape on {what}: fitted tokens per step by confidence {fit.policy.describe()}; "
        f"predicted {fit.predicted.speedup:.3f}x (no expansion "
        f"{fit.no_expansion.speedup:.3f}x)")


def fit_self_spec_cape(ws: Workspace, result, measure_space, space: CapeSpace) -> CapeResult:
    """CAPE on the tuned layer-skip drafter (``result``: the self-spec tuner's)."""
    from autotune.measure.cape_stats import self_spec_chain_steps
    from autotune.measure.draft_trace import DraftTracer

    started = time.monotonic()
    search = ws.encode(split_prompts(ws.prompts)[0])
    calibration = ws.continuations(search[: space.calibration.prompts], space.calibration.tokens)
    with step("cape: draft confidences along greedy decoding", 1) as advance:
        traces = DraftTracer(ws.runner, calibration).traces(result.skip)
        advance()
    depth = result.policy.max_tokens
    chains = [self_spec_chain_steps(t, depth) for t in traces]
    verify = ws.verify_curve(space.max_verify_tokens)
    _, costs = ws.device_costs()
    chain = SelfSpecChain(result.policy, costs.draft_ratio(result.skip) * verify(1))
    fit = fit_expansion(chains, chain, verify, space)
    _announce(fit, "the self-speculative draft")
    held = ws.encode(split_prompts(ws.prompts)[1][: measure_space.confirm_prompts])
    skip, policy = result.skip, result.policy
    measured = measure_with_progress(
        "cape (self-spec): held-back measurement", ws.runner,
        lambda: CapeDrafter(LayerSkipDrafter(skip, policy, max(fit.policy.expansion)),
                            fit.policy), held,
        measure_space.confirm_tokens)
    return CapeResult(fit.policy, None, measured, fit.predicted,
                      _search_info(fit, started, calibration_prompts=len(calibration)))


def fit_eagle_cape(ws: Workspace, result, head_dir: str, eagle_space,
                   space: CapeSpace) -> CapeResult:
    """CAPE on a chain of the tuned EAGLE head, its depth fitted too (``result``: the
    EAGLE tuner's; its draft vocabulary is kept)."""
    from autotune.drafters.eagle import EagleDrafter, StaticTree
    from autotune.measure.cape_stats import eagle_chain_steps
    from autotune.measure.eagle_accuracy import measure_level_costs
    from autotune.tuners.eagle import load_head_for, projection_for, static_draft_seconds
    from autotune.tuners.head_prompts import confirm_and_calibration, unseen_search_prompts
    from autotune.engine.tree import chain_tree

    started = time.monotonic()
    head = load_head_for(ws.ref, head_dir)
    projection = projection_for(ws.ref, head_dir, result.vocab)
    # the EAGLE search's own calibration: its continuations are cached
    search = ws.encode(unseen_search_prompts(ws, head_dir))
    _, rest = confirm_and_calibration(search, eagle_space.trials.confirm_prompts)
    calibration = ws.continuations(rest[: eagle_space.calibration.prompts],
                                   eagle_space.calibration.tokens)
    deepest = space.max_chain_depth
    with step("cape: eagle head confidences along greedy decoding", len(calibration)) as advance:
        chains = eagle_chain_steps(ws.runner, head, calibration, deepest, projection, advance)
    level_costs = measure_level_costs(ws.runner, head, projection=projection)
    verify = ws.verify_curve(space.max_verify_tokens)

    def chain_of(depth: int) -> tuple[FixedChain, list[ChainSteps]]:
        tree = tuple(chain_tree(depth))
        return (FixedChain(depth, static_draft_seconds(tree, level_costs)),
                [ChainSteps(c.confidences[:, :depth], c.ranks[:, :depth]) for c in chains])

    plain = {}
    for d in range(1, deepest + 1):
        rule, truncated = chain_of(d)
        plain[d] = replay(truncated, rule, NO_EXPANSION, verify).speedup
    # fit the two depths that do best without expansion; expansion rarely moves it further
    fits = {}
    for depth in sorted(plain, key=plain.get, reverse=True)[:2]:
        rule, truncated = chain_of(depth)
        fits[depth] = fit_expansion(truncated, rule, verify, space)
    depth = max(fits, key=lambda d: fits[d].predicted.speedup)
    fit = fits[depth]
    _announce(fit, f"an EAGLE chain of depth {depth}")
    held = ws.encode(split_prompts(ws.prompts)[1][: eagle_space.measure.confirm_prompts])
    tree = StaticTree(tuple(chain_tree(depth)))
    measured = measure_with_progress(
        "cape (eagle): held-back measurement", ws.runner,
        lambda: CapeDrafter(EagleDrafter(head, tree, projection, max(fit.policy.expansion)),
                            fit.policy), held,
        eagle_space.measure.confirm_tokens)
    info = _search_info(fit, started, calibration_prompts=len(calibration),
                        predicted_no_expansion_by_depth={str(d): round(v, 4)
                                                         for d, v in plain.items()})
    return CapeResult(fit.policy, depth, measured, fit.predicted, info)


def cape_block(result: CapeResult):
    from autotune.profile.schema import CapeSettings, Measured

    return CapeSettings(bins=list(result.policy.edges), expansion=list(result.policy.expansion),
                        max_verify_tokens=result.policy.max_verify_tokens,
                        chain_depth=result.chain_depth,
                        measured=Measured(**result.measured.summary()),
                        predicted_speedup=round(result.predicted.speedup, 4),
                        search=result.search)


def policy_from_block(block) -> CapePolicy:
    return CapePolicy(tuple(block.bins), tuple(block.expansion), block.max_verify_tokens)

