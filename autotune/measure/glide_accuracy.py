"""How often a GLIDE draft is right, along the target's own greedy decoding, drafting from
the target's cache as it stands at a proposal (stale by the root).

For a root at position p (the last committed token; the target's cache holds 0 .. p - 1)
step j of the draft reads the token at p + j and predicts the one at p + j + 1. Along the
greedy path, step j is drafted as it is when steps 0 .. j - 1 were right: from the true
tokens. So one teacher-forced pass of the target over a calibration sequence gives every
root's cache, and the draft's steps are replayed exactly as ``drafters.glide`` drafts
them: the committed rows see the target below their own position, and every step from
root p sees it below p. All roots are drafted at once, a chunk of roots per forward.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from autotune.engine.runner import Runner
from autotune.heads.eagle import DraftProjection
from autotune.heads.glide import GlideDraft, stale_visibility, teacher_cache
from autotune.measure.cape_stats import ChainSteps
from autotune.measure.draft_trace import MAX_RANK
from autotune.measure.head_accuracy import HeadAccuracy, RankTally, rank_among

ROOTS_PER_FORWARD = 64  # bounds the draft's mask and the logits held at once


@dataclass
class DraftSteps:
    """One calibration sequence of n tokens, roots p = first .. n - 2 (R of them)."""

    hidden: torch.Tensor  # [R, D, H] the draft's final-normed state at each root and step
    truth: torch.Tensor  # [R, D] the token each step should predict, -1 past the end
    first: int  # the first root's position

    @torch.inference_mode()
    def ranks(self, projection: DraftProjection, max_rank: int = MAX_RANK):
        """([R, D] rank of the true token among the draft's top ``max_rank``, -1 if not
        there or past the end; [R, D] the draft's top-1 probability)."""
        roots, depth, _ = self.hidden.shape
        ranks = torch.full((roots, depth), -1, dtype=torch.long)
        confidence = torch.zeros(roots, depth)
        for start in range(0, roots, ROOTS_PER_FORWARD):
            part = slice(start, start + ROOTS_PER_FORWARD)
            logits = projection(self.hidden[part]).float()  # [r, D, V']
            truth = self.truth[part]
            index = projection.indices(truth.clamp(min=0).to(logits.device))
            top = logits.topk(min(max_rank, logits.shape[-1]), dim=-1).indices
            rank = rank_among(top, index).cpu()
            ranks[part] = torch.where(truth >= 0, rank, torch.full_like(rank, -1))
            confidence[part] = logits.softmax(-1).amax(-1).cpu()
        return ranks, confidence


@torch.inference_mode()
def draft_steps(
    runner: Runner, draft: GlideDraft, tokens: list[int], first: int, depth: int
) -> DraftSteps:
    """The draft's state at every root p = first .. n - 2 and step 0 .. depth - 1."""
    n, device = len(tokens), runner.device
    embed, _ = draft.vocabulary(runner)
    target_kv = draft.read_target(teacher_cache(runner, tokens), n)
    ids = torch.tensor(tokens, device=device)
    own = draft.new_cache(capacity=n + ROOTS_PER_FORWARD * depth + 8)
    positions = torch.arange(n, device=device)
    committed = draft(
        embed(ids[None]),
        positions[None],
        target_kv,
        stale_visibility(positions, n)[None, None],
        own,
    )[0]
    roots = torch.arange(first, n - 1, device=device)
    hidden = committed.new_zeros(len(roots), depth, committed.shape[-1])
    hidden[:, 0] = committed[roots]
    for start in range(0, len(roots), ROOTS_PER_FORWARD):
        chunk = roots[start : start + ROOTS_PER_FORWARD]
        if depth > 1:
            hidden[start : start + len(chunk), 1:] = _later_steps(
                draft, embed, ids, target_kv, own, chunk, depth
            )
    steps = torch.arange(depth)
    at = roots.cpu()[:, None] + steps[None] + 1
    truth = torch.where(at < n, ids.cpu()[at.clamp(max=n - 1)], torch.full_like(at, -1))
    return DraftSteps(hidden, truth, first)


def _later_steps(draft, embed, ids, target_kv, own, roots: torch.Tensor, depth: int):
    """[C, depth - 1, H]: steps 1 .. depth - 1 from each root, reading the true tokens.
    Row (c, j) sees the draft's committed entries up to its root, its root's earlier
    steps and itself, and the target below its root."""
    n, count, later = len(ids), len(roots), depth - 1
    device = ids.device
    step = torch.arange(1, depth, device=device)
    positions = (roots[:, None] + step[None]).reshape(-1)  # root-major rows
    tokens = ids[positions.clamp(max=n - 1)]
    prefix = torch.arange(n, device=device)[None] <= roots.repeat_interleave(later)[:, None]
    same_root = torch.block_diag(*[torch.ones(later, later, dtype=torch.bool)] * count)
    causal = torch.ones(later, later, dtype=torch.bool).tril().repeat(count, count)
    mask = torch.cat([prefix, (same_root & causal).to(device)], dim=1)
    cross = stale_visibility(roots.repeat_interleave(later), n)
    out = draft(embed(tokens[None]), positions[None], target_kv, cross[None, None], own, mask)[0]
    own.crop(n)
    return out.view(count, later, -1)


def sequence_steps(
    runner: Runner, draft: GlideDraft, calibration: list[tuple[list[int], list[int]]], depth: int
):
    """One ``DraftSteps`` per (prompt, greedy continuation): roots from the first the
    decoder drafts from (the prefill's token at position len(prompt))."""
    for prompt, continuation in calibration:
        yield draft_steps(runner, draft, prompt + continuation, len(prompt), depth)


def chain_steps(steps: DraftSteps, projection: DraftProjection) -> ChainSteps:
    """CAPE's view of one continuation: row t drafts once continuation[:t] is committed
    (root at len(prompt) + t - 1); row 0, the prefill's, is never drafted."""
    ranks, confidence = steps.ranks(projection)
    depth = ranks.shape[1]
    return ChainSteps(
        np.concatenate([np.zeros((1, depth)), confidence.numpy()]),
        np.concatenate([np.full((1, depth), -1), ranks.numpy()]),
    )


def glide_chain_steps(
    runner: Runner,
    draft: GlideDraft,
    calibration: list[tuple[list[int], list[int]]],
    depth: int,
    projections: dict[int, DraftProjection],
    progress=None,
) -> dict[int, list[ChainSteps]]:
    """For each draft vocabulary (key: its size), the draft's chain along every greedy
    continuation: what it drafts at every root and step while the steps before were
    right, with its confidence there (``ChainSteps``, as ``eagle_chain_steps``). The
    draft runs once; only the projection differs between vocabularies."""
    out: dict[int, list[ChainSteps]] = {size: [] for size in projections}
    for steps in sequence_steps(runner, draft, calibration, depth):
        for size, projection in projections.items():
            out[size].append(chain_steps(steps, projection))
        if progress:
            progress()
    return out


def chain_top1(chains: list[ChainSteps]) -> list[float]:
    """Per drafting step, how often its top-1 token is the target's, over the roots where
    that token exists (steps after the first read the true tokens before them)."""
    depth = chains[0].depth if chains else 0
    right, total = np.zeros(depth), np.zeros(depth)
    for c in chains:
        exists = np.arange(c.roots)[:, None] + np.arange(depth)[None] < c.roots
        exists[0] = False
        right += ((c.ranks == 0) & exists).sum(0)
        total += exists.sum(0)
    return (right / np.maximum(total, 1)).tolist()


def chain_acceptance(chains: list[ChainSteps]) -> list[float]:
    """Per drafting step j, how often a greedy chain's first j + 1 tokens are all right:
    the chance that a draft of j + 1 tokens is accepted whole."""
    depth = chains[0].depth if chains else 0
    right, total = np.zeros(depth), 0
    for c in chains:
        rows = c.ranks[1 : max(c.roots - depth + 1, 1)]  # roots whose whole chain exists
        right += np.cumprod(rows == 0, axis=1).sum(0)
        total += len(rows)
    return (right / max(total, 1)).tolist()


def step_accuracy(
    steps: list[DraftSteps], projection: DraftProjection, max_rank: int = MAX_RANK
) -> HeadAccuracy:
    """Per-step top-k and path accuracy: step j counts the roots whose true token at
    step j exists; a path (r0, ..., rj) is right when each step's true token has that
    rank (steps after the first drafted from the true tokens, as along an accepted path)."""
    depth = steps[0].truth.shape[1] if steps else 1
    tally = RankTally(depth, max_rank)
    for seq in steps:
        ranks, _ = seq.ranks(projection, max_rank)
        available = (seq.truth >= 0).sum(1).tolist()
        for row, count in zip(ranks.tolist(), available):
            tally.add(row, count)
    return tally.accuracy()


@torch.inference_mode()
def measure_step_seconds(
    runner: Runner,
    draft: GlideDraft,
    projection: DraftProjection | None = None,
    context: int = 256,
    repeats: int = 9,
) -> float:
    """Median seconds of one drafting step after ``context`` tokens: the draft over one
    token reading the target's cache, its logits and top-1 probability."""
    embed, lm_head = draft.vocabulary(runner)
    projection = projection or DraftProjection(lm_head)
    device = runner.device
    tokens = torch.randint(0, runner.config.vocab_size, (context,)).tolist()
    target_kv = draft.read_target(teacher_cache(runner, tokens), context)
    own = draft.new_cache(capacity=context + 8)
    positions = torch.arange(context, device=device)
    draft(embed(torch.tensor([tokens], device=device)), positions[None], target_kv, None, own)
    ids = torch.tensor([[tokens[-1]]], device=device)
    at = torch.tensor([[context]], device=device)
    samples = []
    for _ in range(repeats + 1):
        own.crop(context)
        start = time.perf_counter()
        hidden = draft(embed(ids), at, target_kv, None, own)[0]
        float(projection(hidden).float().softmax(-1).max())
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:])
