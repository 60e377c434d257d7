"""How often an EAGLE head is right, along the target's own greedy decoding.

At every position t of a calibration continuation the head drafts ahead as it does in a
tree: step 1 reads the target's features up to t; step k > 1 reads its own step k - 1
output as the feature, with the true token at that depth. In a tree, the child of a node
holding the true token is computed from exactly these inputs, so the rank of the true
token at each step decides which tree paths are accepted: depth d sees the head's own
d-step extrapolation, not the target's features.

All positions are drafted at once: one masked forward per step, in which position t's
query sees the committed pairs up to t and its own earlier steps only.
"""

from __future__ import annotations

import torch

from autotune.engine.runner import Runner
from autotune.heads.eagle import DraftProjection, EagleHead
from autotune.measure.head_accuracy import HeadAccuracy, RankTally, calibration_states, rank_among


@torch.inference_mode()
def extrapolation_ranks(
    head: EagleHead,
    runner: Runner,
    features: torch.Tensor,
    tokens: list[int],
    first: int,
    depth: int,
    max_rank: int = 10,
    projection: DraftProjection | None = None,
    with_confidence: bool = False,
):
    """[R, depth]: for roots t = first .. n - 2 (R of them), the rank of the true token
    x_{t+k+1} in the head's step-k logits, -1 if it is not in the top ``max_rank`` or lies
    past the sequence's end.

    features: [n - 1, H] the target's normed features f_0 .. f_{n-2} of ``tokens`` (n).
    projection: the draft vocabulary (default the whole lm_head); a true token outside it
    has no rank. with_confidence: also return [R, depth] the draft's top-1 probability at
    each step (what CAPE bins on).
    """
    projection = projection or DraftProjection(runner.lm_head)
    n, device = len(tokens), features.device
    ids = torch.tensor(tokens, device=device)
    roots = torch.arange(first, n - 1, device=device)
    count = len(roots)
    cache = head.new_cache(capacity=n + depth * count + 8)
    committed = head(
        features[None], runner.embed(ids[1:])[None], torch.arange(n - 1, device=device)[None], cache
    )[0]
    ranks = torch.full((count, depth), -1, dtype=torch.long)
    confidence = torch.zeros(count, depth)
    previous = committed[roots]  # step-1 outputs, one per root
    for k in range(1, depth + 1):
        if k > 1:
            token_at = (roots + k).clamp(max=n - 1)  # the true token at depth k - 1
            prefix = cache.length(0)
            mask = torch.zeros(count, prefix + count, dtype=torch.bool, device=device)
            mask[:, : n - 1] = torch.arange(n - 1, device=device)[None] <= roots[:, None]
            own = torch.arange(count, device=device)
            for step in range(k - 1):  # this root's earlier steps, and itself
                mask[own, n - 1 + step * count + own] = True
            previous = head(
                previous[None],
                runner.embed(ids[token_at])[None],
                (roots + k - 1)[None],
                cache,
                mask,
            )[0]
        truth_at = roots + k + 1
        inside = truth_at < n
        truth = projection.indices(ids[truth_at.clamp(max=n - 1)])
        logits = projection(previous).float()
        rank = rank_among(logits.topk(max_rank, dim=-1).indices, truth)
        ranks[:, k - 1] = torch.where(inside, rank, torch.full_like(rank, -1)).cpu()
        if with_confidence:
            confidence[:, k - 1] = logits.softmax(-1).amax(-1).cpu()
    return (ranks, confidence) if with_confidence else ranks


@torch.inference_mode()
def measure_eagle_accuracy(
    runner: Runner,
    head: EagleHead,
    calibration: list[tuple[list[int], list[int]]],
    depth: int,
    max_rank: int = 10,
    progress=None,
    projection: DraftProjection | None = None,
) -> HeadAccuracy:
    """Per-depth top-k accuracy and path accuracy over (prompt, greedy continuation)
    pairs; depth d counts positions whose true token at depth d exists."""
    tally = RankTally(depth, max_rank)
    for prompt, continuation in calibration:
        features = runner.norm(calibration_states(runner, prompt, continuation))
        # the first root is the one whose next token is continuation[0]
        tally_extrapolation(
            tally, head, runner, features, prompt + continuation, len(prompt) - 1, projection
        )
        if progress:
            progress()
    return tally.accuracy()


def tally_extrapolation(
    tally: RankTally,
    head: EagleHead,
    runner: Runner,
    features: torch.Tensor,
    tokens: list[int],
    first: int,
    projection: DraftProjection | None = None,
) -> None:
    """Add the ranks of every root from ``first`` on (see ``extrapolation_ranks``) to
    ``tally``, each depth where its true token exists."""
    depth, max_rank = len(tally.positions), tally.hits.shape[1]
    ranks = extrapolation_ranks(
        head, runner, features, tokens, first, depth, max_rank, projection
    ).tolist()
    for i, row in enumerate(ranks):
        tally.add(row, len(tokens) - (first + i) - 2)


@torch.inference_mode()
def measure_level_costs(
    runner: Runner,
    head: EagleHead,
    widths=(1, 2, 4, 8, 16, 32),
    context: int = 256,
    repeats: int = 9,
    projection: DraftProjection | None = None,
) -> dict[int, float]:
    """seconds[width]: median time of one drafting level, the head over ``width`` tree
    nodes plus their logits and top tokens (what expanding that many nodes costs)."""
    import statistics
    import time

    projection = projection or DraftProjection(runner.lm_head)
    device, hidden = runner.device, head.hidden_size
    cache = head.new_cache(capacity=context + max(widths) + 8)
    head(
        torch.zeros(1, context, hidden, dtype=runner.dtype, device=device),
        torch.zeros(1, context, hidden, dtype=runner.dtype, device=device),
        torch.arange(context, device=device)[None],
        cache,
    )
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats + 1):
        for width in widths:
            cache.crop(context)
            features = torch.randn(1, width, hidden, dtype=runner.dtype, device=device)
            start = time.perf_counter()
            out = head(
                features,
                features,
                torch.full((1, width), context, device=device),
                cache,
                torch.ones(width, context + width, dtype=torch.bool, device=device),
            )
            projection(out[0]).float().log_softmax(-1).topk(10, dim=-1)
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples[width].append(time.perf_counter() - start)
    return {w: statistics.median(s[1:]) for w, s in samples.items()}


def level_seconds(costs: dict[int, float], width: int) -> float:
    """Cost of a level of ``width`` nodes, interpolated between measured widths."""
    if width <= 0:
        return 0.0
    known = sorted(costs)
    lower = max((w for w in known if w <= width), default=known[0])
    upper = min((w for w in known if w >= width), default=known[-1])
    if lower == upper:
        return costs[lower] * (width / lower if width > lower else 1.0)
    share = (width - lower) / (upper - lower)
    return costs[lower] + share * (costs[upper] - costs[lower])
