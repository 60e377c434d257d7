"""Static draft trees for Medusa-style heads: Medusa's greedy tree and Sequoia's DP tree.

Pure functions, no model calls. A tree is a list of paths in Medusa's `choices` format:
the path (r0, r1, ..., rd) is head 0's rank-r0 token, then head 1's rank-r1 token, and so
on (ranks are 0-based top-k indices). Every prefix of a path is in the tree. Verifying a
tree of n nodes costs one target forward over n + 1 tokens (the root is the last accepted
token).

path_accuracy[path] is the measured probability that the whole path is right. Siblings are
disjoint events (distinct tokens), so a tree's expected number of accepted draft tokens per
verify step is the sum of path_accuracy over its nodes; one bonus token comes on top.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.engine.tree import canonical_order

Path = tuple[int, ...]
VerifySeconds = Callable[[int], float]  # n_tokens -> seconds of one target forward
DraftSeconds = float | Callable[[int], float]  # constant, or tree depth -> seconds

# Medusa's published 63-node tree for Vicuna-7B (`mc_sim_7b_63` in FasterDecoding/Medusa,
# medusa/model/medusa_choices.py), in its published order.
MC_SIM_7B_63: tuple[Path, ...] = (
    (0,),
    (0, 0),
    (1,),
    (0, 1),
    (2,),
    (0, 0, 0),
    (1, 0),
    (0, 2),
    (3,),
    (0, 3),
    (4,),
    (0, 4),
    (2, 0),
    (0, 5),
    (0, 0, 1),
    (5,),
    (0, 6),
    (6,),
    (0, 7),
    (0, 1, 0),
    (1, 1),
    (7,),
    (0, 8),
    (0, 0, 2),
    (3, 0),
    (0, 9),
    (8,),
    (9,),
    (1, 0, 0),
    (0, 2, 0),
    (1, 2),
    (0, 0, 3),
    (4, 0),
    (2, 1),
    (0, 0, 4),
    (0, 0, 5),
    (0, 0, 0, 0),
    (0, 1, 1),
    (0, 0, 6),
    (0, 3, 0),
    (5, 0),
    (1, 3),
    (0, 0, 7),
    (0, 0, 8),
    (0, 0, 9),
    (6, 0),
    (0, 4, 0),
    (1, 4),
    (7, 0),
    (0, 1, 2),
    (2, 0, 0),
    (3, 1),
    (2, 2),
    (8, 0),
    (0, 5, 0),
    (1, 5),
    (1, 0, 1),
    (0, 2, 1),
    (9, 0),
    (0, 6, 0),
    (0, 0, 0, 1),
    (1, 6),
    (0, 7, 0),
)


# ---------------------------------------------------------------------------- tree shape


def tree_depth(choices: Iterable[Sequence[int]]) -> int:
    return max((len(path) for path in choices), default=0)


def clip_tree(
    choices: Iterable[Sequence[int]], max_depth: int, max_rank: int | None = None
) -> list[Path]:
    """Drop paths deeper than max_depth or using a rank >= max_rank; keep the order.

    A path is also dropped when one of its prefixes is, so the result is prefix-closed.
    """
    paths = [tuple(path) for path in choices]
    candidates = {
        path
        for path in paths
        if len(path) <= max_depth and (max_rank is None or max(path) < max_rank)
    }
    return [
        path
        for path in paths
        if path in candidates and all(path[:d] in candidates for d in range(1, len(path)))
    ]


# ----------------------------------------------------------------------- Medusa greedy


def expected_accepted(
    choices: Iterable[Sequence[int]], path_accuracy: Mapping[Path, float]
) -> float:
    """Expected accepted draft tokens per verify step (the bonus token not counted)."""
    return float(sum(path_accuracy.get(tuple(path), 0.0) for path in choices))


def grow_tree(path_accuracy: Mapping[Path, float], max_nodes: int, max_depth: int) -> list[Path]:
    """Greedy best-first tree; nodes in the order added, so order[:n] is the size-n tree.

    Each step adds the most accurate node whose parent is already in the tree. When
    accuracy falls with rank this frontier is Medusa's (next sibling or first child); any
    measured rank may join, so an out-of-order rank is not blocked by a weaker sibling.
    Because a path's accuracy never exceeds its parent's (the path being right implies its
    prefix is), the tree of every size is the optimum for that size. Stops early when no
    node of positive accuracy is left.
    """
    children: dict[Path, list[Path]] = defaultdict(list)
    for path, accuracy in path_accuracy.items():
        path = tuple(path)
        if accuracy > 0 and 1 <= len(path) <= max_depth:
            children[path[:-1]].append(path)

    def entry(path: Path):
        # ties go to the shallower, then lexicographically smaller path: deterministic
        return (-path_accuracy[path], len(path), path)

    frontier = [entry(path) for path in children[()]]
    heapq.heapify(frontier)
    order: list[Path] = []
    while frontier and len(order) < max_nodes:
        *_, path = heapq.heappop(frontier)
        order.append(path)
        for child in children[path]:
            heapq.heappush(frontier, entry(child))
    return order


@dataclass(frozen=True)
class SizeChoice:
    """One candidate tree with its predicted speed on the measured latency curve."""

    nodes: int
    depth: int
    expected_tokens_per_step: float  # 1 (bonus) + expected accepted draft tokens
    seconds_per_step: float  # draft + verify over nodes + 1 tokens
    tokens_per_second: float
    choices: tuple[Path, ...]


def _draft_cost(draft_seconds: DraftSeconds, depth: int) -> float:
    return float(draft_seconds(depth)) if callable(draft_seconds) else float(draft_seconds)


def _size_choice(
    tree: Sequence[Path],
    accepted: float,
    verify_seconds: VerifySeconds,
    draft_seconds: DraftSeconds,
) -> SizeChoice:
    depth = tree_depth(tree)
    seconds = float(verify_seconds(len(tree) + 1)) + _draft_cost(draft_seconds, depth)
    tokens = 1.0 + accepted
    return SizeChoice(len(tree), depth, tokens, seconds, tokens / seconds, tuple(tree))


def _best_first(choices: list[SizeChoice]) -> list[SizeChoice]:
    # on equal speed the smaller tree wins: less memory, less variance
    return sorted(choices, key=lambda c: (-c.tokens_per_second, c.nodes, c.depth))


def rank_tree_sizes(
    order: Sequence[Path],
    path_accuracy: Mapping[Path, float],
    verify_seconds: VerifySeconds,
    draft_seconds: DraftSeconds = 0.0,
    min_nodes: int = 1,
) -> list[SizeChoice]:
    """Every prefix order[:n] (n >= min_nodes) as a SizeChoice, fastest first.

    draft_seconds is a constant or a function of the tree depth: heads beyond the tree's
    depth need not be evaluated.
    """
    return rank_prefixes(
        order,
        path_accuracy,
        verify_seconds,
        lambda tree: _draft_cost(draft_seconds, tree_depth(tree)),
        min_nodes,
    )


def rank_prefixes(
    order: Sequence[Path],
    path_accuracy: Mapping[Path, float],
    verify_seconds: VerifySeconds,
    tree_seconds: Callable[[Sequence[Path]], float],
    min_nodes: int = 1,
) -> list[SizeChoice]:
    """As ``rank_tree_sizes``, with the drafting cost a function of the whole tree."""
    choices = []
    accepted = 0.0
    for n, path in enumerate(order, start=1):
        accepted += path_accuracy.get(tuple(path), 0.0)
        if n >= min_nodes:
            tree = order[:n]
            choices.append(_size_choice(tree, accepted, verify_seconds, tree_seconds(tree)))
    return _best_first(choices)


# ----------------------------------------------------------------------------- Sequoia


def positional_acceptance(path_accuracy: Mapping[Path, float], max_rank: int) -> list[float]:
    """acceptance[r]: probability that a node's rank-r child is right, given the node is.

    Pooled over depths as a ratio of sums: the right rank-r children over the right
    parents, so each depth weighs as much as it is reached. Parents at the deepest
    measured depth are left out: their children were not measured.
    """
    if not path_accuracy:
        raise ValueError("path_accuracy is empty: nothing to estimate acceptance from")
    accuracy = {tuple(path): value for path, value in path_accuracy.items()}
    measured_depth = tree_depth(accuracy)
    parent_mass = 1.0  # the root is always right
    parent_mass += sum(value for path, value in accuracy.items() if len(path) < measured_depth)
    child_mass = [0.0] * max_rank
    for path, value in accuracy.items():
        parent_known = len(path) == 1 or path[:-1] in accuracy
        if path and path[-1] < max_rank and parent_known:
            child_mass[path[-1]] += value
    return [mass / parent_mass for mass in child_mass]


def modelled_accepted(choices: Iterable[Sequence[int]], acceptance: Sequence[float]) -> float:
    """Expected accepted tokens of a tree when every step accepts rank r with acceptance[r]."""
    total = 0.0
    for path in choices:
        probability = 1.0
        for rank in path:
            probability *= acceptance[rank] if rank < len(acceptance) else 0.0
        total += probability
    return total


class _SequoiaTable:
    """Sequoia's dynamic programme, solved once for every size <= max_nodes and depth.

    best[d][n]: the largest expected number of accepted descendants of an accepted node,
    over subtrees of at most n nodes and depth at most d. A node's children are processed
    in order of falling acceptance (position i); take[d][i][n] is how many of the budget n
    go to the subtree of the child at position i (0: no such child), the rest to later
    positions. Giving the better ranks the children is always optimal, so the search over
    which ranks appear reduces to how to split the budget.
    """

    def __init__(self, acceptance: Sequence[float], max_nodes: int, max_depth: int):
        # ranks that can never be accepted would only spend budget
        self.ranks = sorted(
            (r for r, a in enumerate(acceptance) if a > 0), key=lambda r: (-acceptance[r], r)
        )
        accept = [float(acceptance[r]) for r in self.ranks]
        budget = np.arange(max_nodes + 1)
        remainder = budget[:, None] - budget[None, :]  # [n, s] -> n - s
        feasible = remainder >= 0
        remainder = np.where(feasible, remainder, 0)

        self.best = [np.zeros(max_nodes + 1)]
        self.take: list[list[np.ndarray]] = [[]]
        for _ in range(max_depth):
            below = self.best[-1]
            later = np.zeros(max_nodes + 1)  # no more children: the budget may stay unused
            takes = []
            for a in reversed(accept):
                # subtree[s]: value of a child subtree of s nodes (the child included)
                subtree = np.concatenate(([0.0], a * (1.0 + below[:-1])))
                value = np.where(feasible, subtree[None, :] + later[remainder], -np.inf)
                # argmax takes the first maximum: on ties, the fewer nodes
                take = value.argmax(axis=1)
                later = value[budget, take]
                takes.append(take)
            self.best.append(later)
            self.take.append(takes[::-1])

    def tree(self, nodes: int, depth: int) -> list[Path]:
        out: list[Path] = []
        self._build((), nodes, depth, out)
        return canonical_order(out)

    def _build(self, prefix: Path, budget: int, depth: int, out: list[Path]) -> None:
        if depth == 0:
            return
        for position, rank in enumerate(self.ranks):
            if budget == 0:
                return
            size = int(self.take[depth][position][budget])
            if size:
                child = prefix + (rank,)
                out.append(child)
                self._build(child, size - 1, depth - 1, out)
                budget -= size


def sequoia_tree(acceptance: Sequence[float], max_nodes: int, max_depth: int) -> list[Path]:
    """The tree of at most max_nodes nodes and depth <= max_depth maximising the expected
    accepted tokens when each step accepts its rank-r child with acceptance[r]."""
    return _SequoiaTable(acceptance, max_nodes, max_depth).tree(max_nodes, max_depth)


def sequoia_sizes(
    acceptance: Sequence[float],
    max_nodes: int,
    max_depth: int,
    verify_seconds: VerifySeconds,
    draft_seconds: DraftSeconds = 0.0,
    path_accuracy: Mapping[Path, float] | None = None,
) -> list[SizeChoice]:
    """Sequoia's optimal tree for every size and depth limit, fastest first.

    Seconds per step = draft_seconds(depth) + verify_seconds(nodes + 1), as Sequoia picks
    size and depth (a sequential drafter passes draft_seconds=lambda d: d * t). Trees are
    scored by the acceptance model, or by the measured path_accuracy when given.
    """
    table = _SequoiaTable(acceptance, max_nodes, max_depth)
    seen: set[tuple[Path, ...]] = set()
    choices = []
    for depth in range(1, max_depth + 1):
        for nodes in range(1, max_nodes + 1):
            tree = tuple(table.tree(nodes, depth))
            if not tree or tree in seen:
                continue
            seen.add(tree)
            if path_accuracy is None:
                accepted = float(table.best[depth][nodes])
            else:
                accepted = expected_accepted(tree, path_accuracy)
            choices.append(_size_choice(tree, accepted, verify_seconds, draft_seconds))
    return _best_first(choices)
