"""EAGLE drafting: the head extrapolates the target's features autoregressively, with a
KV cache of its own, and its top tokens fill a static tree (EAGLE-1) or a tree grown per
step by draft confidence (EAGLE-2's dynamic expansion).

The head's cache holds one pair (target feature f_t, token x_{t+1}) per committed
position t. Each proposal first appends the pairs committed since the last one (their
features come from the target's verify forward), then drafts below the root (the last
committed token at position p): a node at depth d holds a guess of x_{p+d}; expanding it
runs the head on (its parent's output, its token) at position p + d - 1, attending to
the committed pairs and its own ancestors. Draft entries are dropped from the head's
cache at the next proposal.

Drafting is written as a generator of head calls (``drafters.in_step``): sequences decoded
together share each round's head forward and draft projection (``propose_all``). Where
the head runs as its fixed-shape step (on a GPU), a proposal is two calls: the commit,
then the whole tree in one step of its own (``heads.tree_step``); the calls level by
level below remain the eager path and the fallback.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

from autotune.drafters.in_step import InStepDrafter, run_by_kind
from autotune.engine import staging
from autotune.engine.kvcache import KVCache
from autotune.engine.proposal import Draft, DraftContext
from autotune.engine.staging import sent
from autotune.engine.tree import ROOT, TreeShape, check_tree
from autotune.heads.eagle import CommitRows, DraftProjection, EagleHead, HeadRows
from autotune.heads.static_head import EagleStep
from autotune.heads.tree_step import (
    DynamicShape,
    Grown,
    Level,
    Tree,
    TreeCall,
    TreeSteps,
    rows_to_take,
)

T = TypeVar("T")

# EAGLE-1's published 25-node static tree (SafeAILab/EAGLE, eagle/model/choices.py).
EAGLE1_TREE: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (2, 1),
    (3, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 1, 1),
    (0, 2, 0),
    (0, 2, 1),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 0, 2),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
)


@dataclass(frozen=True)
class StaticTree:
    """Node [r1, ..., rd] holds the rank-rd token of the head's step-d distribution below
    the path [r1, ..., r(d-1)]."""

    choices: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        object.__setattr__(self, "choices", tuple(check_tree(self.choices)))


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2: ``top_k`` children per frontier node, the best ``top_k`` by cumulative draft
    log-probability kept as the next frontier, ``depth`` expansions after the first level,
    then the best ``total_tokens - 1`` nodes of all (the root makes ``total_tokens``)."""

    total_tokens: int
    depth: int
    top_k: int

    def __post_init__(self):
        if self.total_tokens < 2 or self.depth < 0 or self.top_k < 1:
            raise ValueError(
                f"dynamic tree needs total_tokens >= 2, depth >= 0, top_k >= 1; "
                f"got {self.total_tokens}, {self.depth}, {self.top_k}"
            )


@dataclass
class _HeadCall:
    """Rows a drafting step needs the head to run (a commit's as the target left them),
    the last ``projected`` of them also through the draft projection; ``step``: the
    head's fixed-shape step that lent the rows' cache (None: the head runs eagerly)."""

    rows: HeadRows | CommitRows
    projected: int
    step: EagleStep | None = None


@dataclass
class _HeadOut:
    features: torch.Tensor  # [S, H]: the head's output at each row
    logits: torch.Tensor  # [projected, V']: the draft logits of the last rows


@dataclass
class _TreeCall:
    """A tree drafted in one step of the head (``heads.tree_step``), below
    ``call.features`` and ``call.logits``: the commit call's output at the root."""

    call: TreeCall
    steps: TreeSteps
    tree: Tree


# A drafting step: yields each call it needs and is sent its output (a _HeadCall's: a
# _HeadOut; a _TreeCall's: the tree as drafted, or the root again where the step refused
# it), returns T.
_Drafting = Generator[_HeadCall | _TreeCall, Any, T]


class _Placed(NamedTuple):
    """A static level's rows to take (``rows_to_take``) and its expanded rows' mask, made
    once."""

    picks: torch.Tensor | slice
    expanded: torch.Tensor | slice
    their_parents: torch.Tensor | slice
    seen: torch.Tensor


def pairs_of(rows: HeadRows | CommitRows) -> HeadRows:
    """The rows as the eager head takes them."""
    return rows.pairs() if isinstance(rows, CommitRows) else rows


def _placed(level: Level, runner) -> _Placed:
    """``level`` as ``runner``'s drafts take it, made once: its rows on the device, its
    mask where the head's call takes it (``Runner.input_device``)."""
    return _Placed(
        rows_to_take(level.picks, runner.device),
        rows_to_take(level.expanded, runner.device),
        rows_to_take(level.their_parents, runner.device),
        sent(level.seen, runner.input_device),
    )


class EagleDrafter(InStepDrafter):
    """``projection``: the lm_head over a draft vocabulary (default: the target's whole
    lm_head). ``ranked_width`` > 0 (static chains only): drafts carry each step's top
    tokens and probabilities.

    Drafting keeps the tree's tokens on the device until the draft is complete and
    reads them back once: the head's next call takes its tokens from the last one's
    top-k without a round trip to the host, so a GPU is never left idle between the
    head's calls while the host reads, decides and sends."""

    def __init__(
        self,
        head: EagleHead,
        tree: StaticTree | DynamicTree,
        projection: DraftProjection | None = None,
        ranked_width: int = 0,
    ):
        self.head, self.tree, self.projection = head, tree, projection
        self.cache: KVCache | None = None
        self.step: EagleStep | None = None  # the head's fixed-shape step, where it runs
        self.trees: TreeSteps | None = None  # the tree after the commit in one step, there
        self.committed = 0  # pairs in the head's cache that the target confirmed
        self.ranked_width = ranked_width
        if isinstance(tree, StaticTree):
            self._static_shape = TreeShape.from_choices(tree.choices)
            self._levels = Level.plan(tree.choices)
            self._placed: list[_Placed] = []  # the levels, made at the first draft
            self.max_draft_tokens = len(tree.choices)
            if ranked_width and not self._static_shape.is_chain:
                raise ValueError("ranked tokens are reported for a chain, not a tree")
        else:
            self.max_draft_tokens = tree.total_tokens - 1

    def reset(self) -> None:
        self.cache, self.committed, self.step, self.trees = None, 0, None, None

    @property
    def model(self) -> EagleHead:
        return self.head

    def projection_for(self, runner) -> DraftProjection:
        if self.projection is None:
            self.projection = DraftProjection(runner.lm_head)
        return self.projection

    @staticmethod
    def run_together(
        model: EagleHead, projection: DraftProjection, calls: list[_HeadCall | _TreeCall]
    ) -> list[Any]:
        """Several sequences' calls: their trees in one step of the head, first (they
        copy their roots in before the head's step runs again), and their head calls as
        one head forward and one projection."""
        return run_by_kind(
            calls,
            [
                (_TreeCall, lambda trees: EagleDrafter._trees(projection, trees)),
                (_HeadCall, lambda heads: EagleDrafter._head_calls(model, projection, heads)),
            ],
        )

    @staticmethod
    def _trees(projection: DraftProjection, calls: list) -> list[list[int] | Grown | _HeadOut]:
        """Each tree as drafted, together in their step; where it refuses them (another
        tree, a cache off the step, a refused recording), copies of their roots, from
        which the drafter runs the tree a call at a time: a head call in the same round
        may overwrite the step's outputs they are views of before the drafter reads them."""
        first = calls[0]
        if all(call.steps is first.steps and call.tree == first.tree for call in calls):
            drafted = first.steps.draft([call.call for call in calls], first.tree, projection)
            if drafted is not None:
                return list(drafted)
        return [_HeadOut(call.call.features.clone(), call.call.logits.clone()) for call in calls]

    @staticmethod
    def _head_calls(
        model: EagleHead, projection: DraftProjection, calls: list[_HeadCall]
    ) -> list[_HeadOut]:
        """Head calls as one head forward and one projection: in the head's fixed-shape
        step where they fit it, else eagerly."""
        fixed = EagleDrafter._in_step(projection, calls)
        if fixed is not None:
            return fixed
        features = model.forward_rows([pairs_of(call.rows) for call in calls])
        sizes = [call.rows.positions.shape[0] for call in calls]
        ends = list(itertools.accumulate(sizes))
        rows = [row for call, end in zip(calls, ends) for row in range(end - call.projected, end)]
        logits = projection(features[rows])
        outs, logit = [], 0
        for call, size, end in zip(calls, sizes, ends):
            outs.append(
                _HeadOut(features[end - size : end], logits[logit : logit + call.projected])
            )
            logit += call.projected
        return outs

    @staticmethod
    def _in_step(projection: DraftProjection, calls: list[_HeadCall]) -> list[_HeadOut] | None:
        """The calls run in their step (``heads.static_head``), or None where they have
        none (the target runs eagerly) or do not fit it (``EagleStep.place``)."""
        step = calls[0].step
        if step is None or any(call.step is not step for call in calls):
            return None
        outputs = step.forward([call.rows for call in calls], projection)
        if outputs is None:
            return None
        return [
            _HeadOut(features, logits[-call.projected :])
            for call, (features, logits) in zip(calls, outputs)
        ]

    def drafting(self, context: DraftContext) -> _Drafting[Draft]:
        tree = self.tree
        root = yield from self._commit(context)
        if isinstance(tree, StaticTree):
            tokens, ranked = yield from self._static(context, root, tree)
            draft = Draft(tokens, tree=self._static_shape)
            if ranked is not None and self._static_shape.is_chain:
                draft.ranked_tokens, draft.ranked_probs = ranked
            return draft
        nodes = yield from self._dynamic(context, root, tree)
        return Draft(*self._keep_best(nodes, tree.total_tokens - 1))

    def _cache(self) -> KVCache:
        if self.cache is None:
            raise RuntimeError("the head's cache is made by the first proposal's commit")
        return self.cache

    # --- the head's cache --------------------------------------------------------------

    def _commit(self, context: DraftContext) -> _Drafting[_HeadOut]:
        """Append the newly committed pairs; return the head's output at the root's pair."""
        runner = context.runner
        hidden, tokens = context.hidden, context.tokens
        if hidden is None or tokens is None:
            raise ValueError("EAGLE drafting needs the target's hidden states and tokens")
        if self.cache is None:
            self.cache = self._new_cache(runner, context.position + context.max_tokens + 256)
        cache = self.cache
        cache.crop(self.committed)
        count = hidden.shape[0]
        if self.committed + count != context.position:
            raise RuntimeError(
                f"head cache out of step: {self.committed} pairs + {count} new "
                f"!= position {context.position}"
            )
        next_tokens = torch.tensor([*tokens[1:], context.last_token])  # sent by the call
        positions = torch.arange(self.committed, context.position, device=runner.input_device)
        rows = CommitRows(hidden, next_tokens, positions, cache, runner.norm, runner.embed)
        out = yield _HeadCall(rows, projected=1, step=self.step)
        self.committed = context.position
        return _HeadOut(out.features[-1:], out.logits)

    def _new_cache(self, runner, capacity: int) -> KVCache:
        """The head's cache: lent by the head's fixed-shape step where the target runs
        one of its own (``runner.static``: on a GPU), recorded the same way; else its own."""
        if runner.static is None:
            self.step = self.trees = None
            return self.head.new_cache(capacity)
        self.step = EagleStep.of(self.head, runner.static.how)
        self.trees = TreeSteps.of(self.step, runner.embed)
        return self.step.lend(capacity)

    def _expand(
        self,
        context: DraftContext,
        tokens: torch.Tensor,
        depth: int,
        features: torch.Tensor,
        seen: torch.Tensor,
    ) -> _Drafting[_HeadOut]:
        """Run the head on S nodes at ``depth``: their tokens [S] (on the device), their
        parents' outputs ``features`` [S, H], each row attending to the committed pairs
        and, of the draft rows in the head's cache and its own call, to those ``seen``
        [S, P' + S] allows (P': the draft rows of earlier calls). Returns their outputs."""
        runner, cache = context.runner, self._cache()
        count = tokens.shape[0]
        committed = torch.ones(count, self.committed, dtype=torch.bool, device=seen.device)
        positions = torch.full((count,), context.position + depth - 1, device=runner.input_device)
        mask = torch.cat([committed, seen], dim=1)
        rows = HeadRows(features, runner.embed(tokens), positions, cache, mask)
        return (yield _HeadCall(rows, projected=count, step=self.step))

    def _in_one_step(
        self, context: DraftContext, root: _HeadOut, tree: Tree
    ) -> _Drafting[tuple[Any, _HeadOut]]:
        """The tree drafted in one step of the head (``heads.tree_step``): (the draft, the
        root), or (None, a copy of the root) where the step refused it, to draft the tree
        from a call at a time."""
        assert self.trees is not None  # where the head runs as its step
        call = TreeCall(self._cache(), context.position, root.features, root.logits)
        drafted = yield _TreeCall(call, self.trees, tree)
        return (None, drafted) if isinstance(drafted, _HeadOut) else (drafted, root)

    # --- static trees ------------------------------------------------------------------

    def _static(self, context: DraftContext, root: _HeadOut, tree: StaticTree) -> _Drafting[tuple]:
        """The tree's tokens, and (with ``ranked_width``) each level's top tokens and
        probabilities; every level's tokens picked on the device, read back at the end."""
        if self.trees is not None and not self.ranked_width:
            drafted, root = yield from self._in_one_step(context, root, tree.choices)
            if drafted is not None:
                return drafted, None
        runner, project = context.runner, self.projection_for(context.runner)
        if not self._placed:
            self._placed = [_placed(level, runner) for level in self._levels]
        logits, features = root.logits, root.features  # the first level's parent: the root
        found, ranked = [], []
        for level, (picks, expanded, their_parents, seen) in zip(self._levels, self._placed):
            if self.ranked_width:
                ranked.append(logits.float().softmax(-1).topk(self.ranked_width))
            best = project.tokens(logits.topk(level.width).indices)  # [parents, width]
            tokens = best.view(-1)[picks]
            found.append(tokens)
            if level.expanded:
                out = yield from self._expand(
                    context, tokens[expanded], level.depth, features[their_parents], seen
                )
                logits, features = out.logits, out.features
        drafted = torch.cat(found).tolist()
        if not ranked:
            return drafted, None
        return drafted, (
            project.tokens(torch.cat([r.indices for r in ranked])),
            torch.cat([r.values for r in ranked]),
        )

    # --- EAGLE-2 dynamic trees ---------------------------------------------------------

    def _dynamic(
        self, context: DraftContext, root: _HeadOut, tree: DynamicTree
    ) -> _Drafting[Grown]:
        """Grow the tree on the device: each expansion's frontier, scores, parents and
        masks are taken there from the last one's top-k; the tree is read back once."""
        if self.trees is not None:
            shape = DynamicShape(tree.depth, tree.top_k)
            drafted, root = yield from self._in_one_step(context, root, shape)
            if drafted is not None:
                return drafted
        project, k = self.projection_for(context.runner), tree.top_k
        device = root.logits.device
        scores, best = root.logits.float().log_softmax(-1)[0].topk(k)
        tokens = project.tokens(best)
        grown = [(tokens, scores, torch.full((k,), ROOT, device=device))]
        frontier, features = torch.arange(k, device=device), root.features.expand(k, -1)
        own = torch.eye(k, dtype=torch.bool, device=device)
        seen, first = own, 0  # the frontier's draft rows seen; its first node's index
        for depth in range(1, tree.depth + 1):
            out = yield from self._expand(context, tokens, depth, features, seen)
            child_logp, child_best = out.logits.float().log_softmax(-1).topk(k, dim=-1)
            tokens = project.tokens(child_best).view(-1)  # [k * k]: each parent's k children
            scores = (scores[:, None] + child_logp).view(-1)
            grown.append((tokens, scores, frontier.repeat_interleave(k)))
            first += len(grown[-2][0])
            if depth == tree.depth:
                break
            scores, kept = scores.topk(k)  # the next frontier: the best k children
            tokens, frontier, parents = tokens[kept], first + kept, kept // k
            features = out.features[parents]
            seen = torch.cat([seen[parents], own], dim=1)
        return self._read_back(grown)

    @staticmethod
    def _read_back(grown: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Grown:
        """The grown tree on the host: per expansion its nodes' tokens, scores and parents."""
        ids = staging.read_back(
            torch.cat([tokens for tokens, _, _ in grown] + [p for _, _, p in grown])
        )
        scores = staging.read_back(torch.cat([s for _, s, _ in grown]))
        count = len(scores)
        depths = np.repeat(np.arange(1, len(grown) + 1), [len(tokens) for tokens, _, _ in grown])
        return Grown(ids[:count], ids[count:], scores, depths)

    @staticmethod
    def _keep_best(nodes: Grown, count: int) -> tuple[list[int], None, TreeShape]:
        """The ``count`` best nodes by cumulative log-probability, as a tree: a child never
        scores above its parent, and ties go to the shallower node, so every kept node's
        parent is kept. (Sorted in numpy: EAGLE-2's 60/5/10 ranks 510 nodes a draft.)"""
        number = np.arange(len(nodes.tokens))
        depths, parents = nodes.depths, nodes.parents
        ranked = np.lexsort((number, depths, -nodes.scores))[:count]
        kept = ranked[np.lexsort((ranked, depths[ranked]))]  # parents before children
        index = np.full(len(number) + 1, ROOT)  # node -> its place in ``kept``; ROOT: ROOT
        index[kept] = np.arange(len(kept))
        tokens = nodes.tokens[kept].tolist()
        return tokens, None, TreeShape(tuple(index[parents[kept]].tolist()))
