"""Medusa greedy trees and Sequoia DP trees (autotune/tuners/medusa_tree.py), model-free."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autotune.engine.tree import canonical_order, chain_tree, check_tree
from autotune.tuners.medusa_tree import (
    MC_SIM_7B_63,
    clip_tree,
    expected_accepted,
    grow_tree,
    modelled_accepted,
    positional_acceptance,
    rank_tree_sizes,
    sequoia_sizes,
    sequoia_tree,
)

RANKS, DEPTH, MAX_SIZE = 3, 3, 5  # the brute-force universe: 3 + 9 + 27 nodes


def is_prefix_closed(tree) -> bool:
    nodes = {tuple(path) for path in tree}
    return all(tuple(path)[:d] in nodes for path in nodes for d in range(1, len(path)))


def all_paths(ranks: int, depth: int):
    return [p for d in range(1, depth + 1) for p in itertools.product(range(ranks), repeat=d)]


def all_trees(ranks: int, depth: int, max_size: int) -> dict[int, set[frozenset]]:
    """Every prefix-closed tree of each size, grown one node at a time."""
    universe = all_paths(ranks, depth)
    trees = {0: {frozenset()}}
    for size in range(1, max_size + 1):
        trees[size] = {
            tree | {path}
            for tree in trees[size - 1]
            for path in universe
            if path not in tree and (len(path) == 1 or path[:-1] in tree)
        }
    return trees


TREES = all_trees(RANKS, DEPTH, MAX_SIZE)


def event_accuracy(seed: int, ranks: int = RANKS, depth: int = DEPTH) -> dict:
    """Path accuracies that behave like measured events: siblings are disjoint (their
    accuracies sum to at most the parent's) and rank order is not always accuracy order."""
    rng = np.random.default_rng(seed)
    accuracy = {(): 1.0}
    for path in [()] + all_paths(ranks, depth - 1):
        shares = rng.dirichlet(np.ones(ranks + 1))  # the last share: no rank is right
        for rank in range(ranks):
            accuracy[path + (rank,)] = accuracy[path] * shares[rank]
    del accuracy[()]
    return accuracy


def product_accuracy(acceptance, depth: int) -> dict:
    """Path accuracies of Sequoia's model: each step accepts rank r with acceptance[r]."""
    return {
        path: float(np.prod([acceptance[r] for r in path]))
        for path in all_paths(len(acceptance), depth)
    }


# ---------------------------------------------------------------------------- tree shape


def test_mc_sim_7b_63_is_a_valid_63_node_tree():
    assert len(MC_SIM_7B_63) == 63 and len(set(MC_SIM_7B_63)) == 63
    assert is_prefix_closed(MC_SIM_7B_63)
    check_tree(MC_SIM_7B_63, num_heads=4)
    assert max(len(p) for p in MC_SIM_7B_63) == 4 and max(max(p) for p in MC_SIM_7B_63) == 9
    assert MC_SIM_7B_63[:4] == ((0,), (0, 0), (1,), (0, 1))


def test_chain_tree():
    assert chain_tree(3) == [(0,), (0, 0), (0, 0, 0)]
    assert chain_tree(0) == []


def test_clip_tree_to_depth_two_keeps_order_and_closure():
    clipped = clip_tree(MC_SIM_7B_63, max_depth=2)
    assert clipped == [p for p in MC_SIM_7B_63 if len(p) <= 2]
    assert is_prefix_closed(clipped)


def test_clip_tree_by_rank_drops_descendants_of_dropped_paths():
    clipped = clip_tree(MC_SIM_7B_63, max_depth=4, max_rank=2)
    assert all(max(p) < 2 for p in clipped) and is_prefix_closed(clipped)
    assert (0, 0, 0, 1) in clipped and (2, 0) not in clipped
    # an input that is not prefix-closed: [1, 0] loses its parent [1]
    assert clip_tree([[0], [1, 0], [0, 3]], max_depth=2, max_rank=3) == [(0,)]


def test_canonical_order_is_by_depth_then_lexicographic():
    ordered = canonical_order(MC_SIM_7B_63)
    assert ordered[:11] == [(r,) for r in range(10)] + [(0, 0)]
    assert ordered[-2:] == [(0, 0, 0, 0), (0, 0, 0, 1)]
    assert sorted(ordered) == sorted(MC_SIM_7B_63)
    assert canonical_order([[1], [0, 1], [0], [0, 0]]) == [(0,), (1,), (0, 0), (0, 1)]


@pytest.mark.parametrize(
    "tree, heads, message",
    [
        ([], 4, "empty"),
        ([[0], [1, 0]], 4, r"path \[1, 0\] needs its prefix \[1\]"),
        ([[0], [0, 0], [0]], 4, r"path \[0\] appears more than once"),
        ([[0], [-1]], 4, "negative rank"),
        ([[0], []], 4, "empty path"),
        ([[0], [0, 0], [0, 0, 0]], 2, "tree depth 3 needs 3 heads; the heads provide 2"),
    ],
)
def test_check_tree_messages(tree, heads, message):
    with pytest.raises(ValueError, match=message):
        check_tree(tree, num_heads=heads)


def test_check_tree_accepts_lists_and_tuples():
    check_tree([[0], [0, 0], [1]], num_heads=2)
    check_tree(chain_tree(5), num_heads=5)


# ----------------------------------------------------------------------- Medusa greedy


@pytest.mark.parametrize("seed", range(6))
def test_greedy_matches_brute_force_optimum_at_every_size(seed):
    accuracy = event_accuracy(seed)
    order = grow_tree(accuracy, max_nodes=MAX_SIZE, max_depth=DEPTH)
    assert len(order) == MAX_SIZE
    for size in range(1, MAX_SIZE + 1):
        best = max(expected_accepted(tree, accuracy) for tree in TREES[size])
        assert expected_accepted(order[:size], accuracy) == pytest.approx(best)


def test_greedy_is_nested_prefix_closed_and_within_caps():
    accuracy = event_accuracy(7, ranks=4, depth=5)
    order = grow_tree(accuracy, max_nodes=40, max_depth=3)
    assert len(order) == 40 and len(set(order)) == 40
    assert all(len(p) <= 3 for p in order)
    assert all(is_prefix_closed(order[:n]) for n in range(1, 41))
    values = [accuracy[p] for p in order]
    # a prefix-closed best-first walk on child <= parent accuracies adds in falling order
    assert values == sorted(values, reverse=True)


def test_greedy_stops_when_no_positive_accuracy_is_left():
    accuracy = {(0,): 0.6, (1,): 0.2, (0, 0): 0.3, (0, 1): 0.0, (2,): 0.0, (5, 0): 0.9}
    assert grow_tree(accuracy, max_nodes=10, max_depth=4) == [(0,), (0, 0), (1,)]
    assert grow_tree(accuracy, max_nodes=10, max_depth=1) == [(0,), (1,)]
    assert grow_tree(accuracy, max_nodes=0, max_depth=3) == []


def test_greedy_takes_an_out_of_order_rank_without_its_weaker_sibling():
    accuracy = {(0,): 0.5, (1,): 0.05, (2,): 0.3}
    assert grow_tree(accuracy, max_nodes=2, max_depth=1) == [(0,), (2,)]


def test_expected_accepted_sums_node_accuracies():
    accuracy = {(0,): 0.6, (0, 0): 0.4, (1,): 0.1}
    assert expected_accepted([[0], [0, 0], [1], [2]], accuracy) == pytest.approx(1.1)


# ------------------------------------------------------------------------- tree sizes

GEOMETRIC = [0.7, 0.15, 0.05]


def test_rank_tree_sizes_prefers_small_trees_when_verify_cost_is_steep():
    accuracy = product_accuracy(GEOMETRIC, 4)
    order = grow_tree(accuracy, max_nodes=30, max_depth=4)
    ranked = rank_tree_sizes(order, accuracy, verify_seconds=lambda n: 1.0 + 0.5 * (n - 1))
    assert ranked[0].nodes == 1 and ranked[0].choices == ((0,),)
    assert ranked[0].expected_tokens_per_step == pytest.approx(1.7)
    assert ranked[0].tokens_per_second == pytest.approx(1.7 / 1.5)
    speeds = [c.tokens_per_second for c in ranked]
    assert speeds == sorted(speeds, reverse=True) and len(ranked) == 30


def test_rank_tree_sizes_prefers_the_largest_tree_when_verify_is_flat():
    accuracy = product_accuracy(GEOMETRIC, 4)
    order = grow_tree(accuracy, max_nodes=30, max_depth=4)
    ranked = rank_tree_sizes(order, accuracy, verify_seconds=lambda n: 0.02)
    assert ranked[0].nodes == 30
    assert ranked[0].choices == tuple(order)
    total = 1 + expected_accepted(order, accuracy)
    assert ranked[0].expected_tokens_per_step == pytest.approx(total)


def test_rank_tree_sizes_stops_at_the_latency_knee():
    accuracy = product_accuracy(GEOMETRIC, 4)
    order = grow_tree(accuracy, max_nodes=30, max_depth=4)

    # flat up to 16 tokens (15 nodes), then every token costs as much as a whole forward
    def knee(n):
        return 1.0 if n <= 16 else 1.0 + (n - 16)

    ranked = rank_tree_sizes(order, accuracy, verify_seconds=knee, min_nodes=3)
    assert ranked[0].nodes == 15
    assert min(c.nodes for c in ranked) == 3


def test_rank_tree_sizes_charges_draft_cost_by_depth():
    accuracy = product_accuracy(GEOMETRIC, 4)
    order = grow_tree(accuracy, max_nodes=30, max_depth=4)
    deep_is_dear = rank_tree_sizes(order, accuracy, lambda n: 1.0, draft_seconds=lambda d: 10.0 * d)
    assert deep_is_dear[0].depth == 1
    constant = rank_tree_sizes(order, accuracy, lambda n: 1.0, draft_seconds=10.0)
    assert constant[0].nodes == 30
    assert constant[0].seconds_per_step == pytest.approx(11.0)


# ----------------------------------------------------------------------------- Sequoia


@pytest.mark.parametrize("acceptance", [[0.6, 0.2, 0.1], [0.3, 0.5, 0.15], [0.9, 0.0, 0.05]])
def test_sequoia_is_optimal_against_brute_force(acceptance):
    for size in range(1, MAX_SIZE + 1):
        for depth in range(1, DEPTH + 1):
            tree = sequoia_tree(acceptance, max_nodes=size, max_depth=depth)
            assert len(tree) <= size and max(len(p) for p in tree) <= depth
            assert is_prefix_closed(tree)
            # the DP spends at most the budget: compare with every smaller size too
            best = max(
                modelled_accepted(t, acceptance)
                for k in range(1, size + 1)
                for t in TREES[k]
                if max(len(p) for p in t) <= depth
            )
            assert modelled_accepted(tree, acceptance) == pytest.approx(best)


def test_sequoia_and_greedy_agree_under_the_independence_model():
    accuracy = product_accuracy(GEOMETRIC, 5)
    order = grow_tree(accuracy, max_nodes=40, max_depth=5)
    for size in range(1, 41):
        tree = sequoia_tree(GEOMETRIC, max_nodes=size, max_depth=5)
        assert len(tree) == size
        assert expected_accepted(tree, accuracy) == pytest.approx(
            expected_accepted(order[:size], accuracy)
        )


@pytest.mark.parametrize("seed", range(4))
def test_sequoia_beats_greedy_on_the_model_it_optimises(seed):
    # greedy grows on depth-dependent accuracies; Sequoia optimises the pooled model
    accuracy = event_accuracy(seed, ranks=3, depth=4)
    acceptance = positional_acceptance(accuracy, max_rank=3)
    order = grow_tree(accuracy, max_nodes=20, max_depth=4)
    for size in (1, 3, 8, 20):
        tree = sequoia_tree(acceptance, max_nodes=size, max_depth=4)
        assert (
            modelled_accepted(tree, acceptance)
            >= modelled_accepted(order[:size], acceptance) - 1e-12
        )
        # and greedy wins on the measured accuracies it grew on
        assert (
            expected_accepted(order[:size], accuracy) >= expected_accepted(tree, accuracy) - 1e-12
        )


def test_sequoia_skips_ranks_that_are_never_accepted():
    tree = sequoia_tree([0.5, 0.0, 0.3], max_nodes=5, max_depth=2)
    assert tree == [(0,), (2,), (0, 0), (0, 2), (2, 0)]
    assert sequoia_tree([0.5, 0.0, 0.3], max_nodes=3, max_depth=2) == [(0,), (2,), (0, 0)]
    # not enough acceptable ranks for the budget: the tree stops short of it
    assert sequoia_tree([0.5], max_nodes=10, max_depth=3) == chain_tree(3)


def test_positional_acceptance_recovers_the_vector_of_product_accuracies():
    acceptance = [0.5, 0.2, 0.1, 0.05]
    estimate = positional_acceptance(product_accuracy(acceptance, 3), max_rank=4)
    assert estimate == pytest.approx(acceptance)
    top_two = positional_acceptance(product_accuracy(acceptance, 3), max_rank=2)
    assert top_two == pytest.approx([0.5, 0.2])


def test_positional_acceptance_pools_depths_by_parent_mass():
    # depth 1: rank 0 right 0.8 of the time; depth 2 given (0,): rank 0 right half the time
    accuracy = {(0,): 0.8, (1,): 0.1, (0, 0): 0.4, (1, 0): 0.0}
    estimate = positional_acceptance(accuracy, max_rank=2)
    assert estimate == pytest.approx([(0.8 + 0.4) / (1 + 0.8 + 0.1), 0.1 / 1.9])
    with pytest.raises(ValueError, match="empty"):
        positional_acceptance({}, max_rank=2)


def test_sequoia_sizes_picks_size_and_depth_by_cost():
    acceptance = [0.7, 0.15, 0.05]
    flat = sequoia_sizes(acceptance, 20, 4, verify_seconds=lambda n: 1.0)
    assert flat[0].nodes == 20
    assert flat[0].expected_tokens_per_step == pytest.approx(
        1 + modelled_accepted(flat[0].choices, acceptance)
    )
    # a sequential drafter pays per depth: a dear draft step keeps the tree shallow
    sequential = sequoia_sizes(acceptance, 20, 4, lambda n: 1.0, draft_seconds=lambda d: 2.0 * d)
    assert sequential[0].depth == 1
    assert sequential[0].seconds_per_step == pytest.approx(3.0)
    trees = [c.choices for c in sequential]
    assert len(trees) == len(set(trees))
    measured = product_accuracy(acceptance, 4)
    scored = sequoia_sizes(acceptance, 20, 4, lambda n: 1.0, path_accuracy=measured)
    assert scored[0].expected_tokens_per_step == pytest.approx(flat[0].expected_tokens_per_step)


def test_sequoia_at_full_size():
    acceptance = [0.6 * 0.6**r for r in range(10)]
    tree = sequoia_tree(acceptance, max_nodes=128, max_depth=8)
    ranked = sequoia_sizes(acceptance, 128, 8, verify_seconds=lambda n: 1.0 + 0.01 * n)
    assert len(tree) == 128 and max(len(p) for p in tree) <= 8
    check_tree(tree, num_heads=8)
    assert ranked[0].tokens_per_second >= ranked[-1].tokens_per_second
