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
together share each round's head forward and draft projection (``propose_all``).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

import torch

from autotune.drafters.in_step import InStepDrafter
from autotune.engine.kvcache import KVCache
from autotune.engine.proposal import Draft, DraftContext
from autotune.engine.tree import ROOT, TreeShape, check_tree
from autotune.heads.eagle import DraftProjection, EagleHead, HeadRows
from autotune.heads.static_head import EagleStep

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
    """Rows a drafting step needs the head to run, the last ``projected`` of them also
    through the draft projection; ``step``: the head's fixed-shape step that lent the
    rows' cache (None: the head runs eagerly)."""

    rows: HeadRows
    projected: int
    step: EagleStep | None = None


@dataclass
class _HeadOut:
    features: torch.Tensor  # [S, H]: the head's output at each row
    logits: torch.Tensor  # [projected, V']: the draft logits of the last rows


# A drafting step: yields each head call it needs, is sent its output, returns T.
_Drafting = Generator[_HeadCall, _HeadOut, T]


@dataclass
class _Nodes:
    """A growing draft tree; ``scores``: cumulative draft log-probabilities."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]
    depths: list[int]

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        return len(self.tokens) - 1


class EagleDrafter(InStepDrafter):
    """``projection``: the lm_head over a draft vocabulary (default: the target's whole
    lm_head). ``ranked_width`` > 0 (static chains only): drafts carry each step's top
    tokens and probabilities."""

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
        self.committed = 0  # pairs in the head's cache that the target confirmed
        self.ranked_width = ranked_width
        if isinstance(tree, StaticTree):
            self._plan_static(tree.choices)
            self.max_draft_tokens = len(tree.choices)
            if ranked_width and not self._static_shape.is_chain:
                raise ValueError("ranked tokens are reported for a chain, not a tree")
        else:
            self.max_draft_tokens = tree.total_tokens - 1

    def reset(self) -> None:
        self.cache, self.committed, self.step = None, 0, None

    @property
    def model(self) -> EagleHead:
        return self.head

    def projection_for(self, runner) -> DraftProjection:
        if self.projection is None:
            self.projection = DraftProjection(runner.lm_head)
        return self.projection

    @staticmethod
    def run_together(
        model: EagleHead, projection: DraftProjection, calls: list[_HeadCall]
    ) -> list[_HeadOut]:
        """Several sequences' head calls as one head forward and one projection: in the
        head's fixed-shape step where they fit it, else eagerly."""
        fixed = EagleDrafter._in_step(projection, calls)
        if fixed is not None:
            return fixed
        features = model.forward_rows([call.rows for call in calls])
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
            tokens, ranked = yield from self._static(context, root)
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
        next_tokens = torch.tensor([*tokens[1:], context.last_token], device=runner.device)
        positions = torch.arange(self.committed, context.position, device=runner.input_device)
        rows = HeadRows(runner.norm(hidden), runner.embed(next_tokens), positions, cache)
        out = yield _HeadCall(rows, projected=1, step=self.step)
        self.committed = context.position
        self._column: dict[int, int] = {}  # node -> its head-cache column
        self._columns: dict[int, list[int]] = {ROOT: []}  # node -> its ancestors' columns
        return _HeadOut(out.features[-1:], out.logits)

    def _new_cache(self, runner, capacity: int) -> KVCache:
        """The head's cache: lent by the head's fixed-shape step where the target runs
        one of its own (``runner.static``: on a GPU), recorded the same way; else its own."""
        if runner.static is None:
            self.step = None
            return self.head.new_cache(capacity)
        self.step = EagleStep.of(self.head, runner.static.how)
        return self.step.lend(capacity)

    def _expand(
        self, context: DraftContext, nodes: _Nodes, chosen: list[int], features: torch.Tensor
    ) -> _Drafting[_HeadOut]:
        """Run the head on nodes ``chosen`` (features [S, H]: their parents' outputs);
        return their outputs [S, H]."""
        runner, cache = context.runner, self._cache()
        prefix = cache.length(0)
        mask = torch.zeros(len(chosen), prefix + len(chosen), dtype=torch.bool)
        mask[:, : self.committed] = True
        for row, node in enumerate(chosen):
            parent = nodes.parents[node]
            seen = self._columns[parent] + ([] if parent == ROOT else [self._column[parent]])
            self._columns[node] = seen
            mask[row, seen] = True
            mask[row, prefix + row] = True
            self._column[node] = prefix + row
        ids = torch.tensor([nodes.tokens[n] for n in chosen], device=runner.device)
        positions = torch.tensor(  # the head's step sends them from the host
            [context.position + nodes.depths[n] - 1 for n in chosen], device=runner.input_device
        )
        rows = HeadRows(features, runner.embed(ids), positions, cache, mask.to(runner.input_device))
        return (yield _HeadCall(rows, projected=len(chosen), step=self.step))

    # --- static trees ------------------------------------------------------------------

    def _plan_static(self, choices) -> None:
        shape = self._static_shape = TreeShape.from_choices(choices)
        self._ranks = [path[-1] for path in choices]
        depth = max(len(path) for path in choices)
        self._levels = [
            [i for i, p in enumerate(choices) if len(p) == d] for d in range(1, depth + 1)
        ]
        has_children = {p[:-1] for p in choices if len(p) > 1}
        self._expanded = [
            [i for i in level if choices[i] in has_children] for level in self._levels
        ]
        # per parent (ROOT or node): how many of its top tokens its children take
        self._widths = {
            parent - 1: 1 + max(self._ranks[c] for c in children)
            for parent, children in enumerate(shape.children)
            if children
        }

    def _static(self, context: DraftContext, root: _HeadOut) -> _Drafting[tuple]:
        """The tree's tokens, and (with ``ranked_width``) each expanded node's top tokens
        and probabilities, in expansion order."""
        parents, project = self._static_shape.parents, self.projection_for(context.runner)
        nodes = _Nodes([], [], [], [])
        outputs = {ROOT: root.features[0]}
        logits = {ROOT: root.logits[0]}
        picked: dict[int, list[int]] = {}  # parent -> its top tokens, best first
        ranked = []
        for level, expanded in zip(self._levels, self._expanded):
            for node in level:
                parent = parents[node]
                if parent not in picked:
                    if self.ranked_width:
                        ranked.append(logits[parent].float().softmax(-1).topk(self.ranked_width))
                    best = logits[parent].topk(self._widths[parent]).indices
                    picked[parent] = project.tokens(best).tolist()
                nodes.add(picked[parent][self._ranks[node]], parent, 0.0)
            if expanded:
                features = torch.stack([outputs[parents[n]] for n in expanded])
                out = yield from self._expand(context, nodes, expanded, features)
                for row, (node, row_logits) in enumerate(zip(expanded, out.logits)):
                    outputs[node], logits[node] = out.features[row], row_logits
        if not ranked:
            return nodes.tokens, None
        return nodes.tokens, (
            project.tokens(torch.stack([r.indices for r in ranked])),
            torch.stack([r.values for r in ranked]),
        )

    # --- EAGLE-2 dynamic trees ---------------------------------------------------------

    def _dynamic(
        self, context: DraftContext, root: _HeadOut, tree: DynamicTree
    ) -> _Drafting[_Nodes]:
        project = self.projection_for(context.runner)
        nodes = _Nodes([], [], [], [])
        scores, best = root.logits.float().log_softmax(-1)[0].topk(tree.top_k)
        tokens = project.tokens(best)
        frontier = [nodes.add(t, ROOT, s) for t, s in zip(tokens.tolist(), scores.tolist())]
        features = root.features.expand(len(frontier), -1)
        for _ in range(tree.depth):
            out = yield from self._expand(context, nodes, frontier, features)
            logp = out.logits.float().log_softmax(-1)
            child_logp, child_best = logp.topk(tree.top_k, dim=-1)  # [F, k]
            child_tokens = project.tokens(child_best)
            total = torch.tensor([nodes.scores[n] for n in frontier])[:, None] + child_logp.cpu()
            children = [
                [nodes.add(t, parent, s) for t, s in zip(row_t, row_s)]
                for parent, row_t, row_s in zip(frontier, child_tokens.tolist(), total.tolist())
            ]
            flat = [c for row in children for c in row]
            kept = sorted(range(len(flat)), key=lambda i: -nodes.scores[flat[i]])[: tree.top_k]
            frontier = [flat[i] for i in kept]
            features = out.features[[i // tree.top_k for i in kept]]
        return nodes

    @staticmethod
    def _keep_best(nodes: _Nodes, count: int) -> tuple[list[int], None, TreeShape]:
        """The ``count`` best nodes by cumulative log-probability, as a tree: a child never
        scores above its parent, and ties go to the shallower node, so every kept node's
        parent is kept."""
        ranked = sorted(
            range(len(nodes.tokens)), key=lambda n: (-nodes.scores[n], nodes.depths[n], n)
        )[:count]
        kept = sorted(ranked, key=lambda n: (nodes.depths[n], n))
        index = {node: i for i, node in enumerate(kept)}
        parents = tuple(ROOT if nodes.parents[n] == ROOT else index[nodes.parents[n]] for n in kept)
        return [nodes.tokens[n] for n in kept], None, TreeShape(parents)
