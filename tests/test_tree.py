"""Tree verification: shapes, acceptance rules, and lossless tree decoding."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from autotune.drafters.medusa import MedusaDrafter, TreeTooDeepError
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.proposal import Draft, DraftContext, Drafter, VerifyResult
from autotune.engine.runner import Runner
from autotune.engine.sampling import SamplingConfig
from autotune.engine.tree import TreeShape, canonical_order, check_tree
from autotune.engine.verify import (
    TypicalAcceptance,
    accept_tree_greedy,
    accept_tree_sampled,
    accept_tree_typical,
)
from autotune.heads.medusa import MedusaHeads

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3], [1, 40, 41, 42, 43, 44, 45, 46, 47, 48], [1, 7]]
SMALL_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2]]


def logits_for(rows: list[int], vocab: int = 10) -> torch.Tensor:
    out = torch.zeros(len(rows), vocab)
    for i, token in enumerate(rows):
        out[i, token] = 5.0
    return out


# --- shapes ------------------------------------------------------------------------


def test_tree_shape_from_choices():
    paths = canonical_order(SMALL_TREE)
    assert paths == [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    tree = TreeShape.from_choices(paths)
    assert tree.parents == (-1, -1, -1, 0, 0, 1, 3)
    assert tree.depths == (1, 1, 1, 2, 2, 2, 3)
    assert tree.children[0] == (0, 1, 2) and tree.children[1] == (3, 4)
    assert tree.position_offsets("cpu").tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    mask = tree.attention_mask("cpu")
    # node [0, 0, 0] (row 7) sees the root, [0], [0, 0] and itself only
    assert mask[7].nonzero().flatten().tolist() == [0, 1, 4, 7]
    # siblings never see each other
    assert not mask[2, 1] and not mask[5, 4]
    assert not tree.is_chain and TreeShape.chain(4).is_chain


def test_check_tree_messages():
    with pytest.raises(ValueError, match="needs its prefix"):
        check_tree([[0], [1, 0]])
    with pytest.raises(ValueError, match="more than once"):
        check_tree([[0], [0]])
    with pytest.raises(ValueError, match="empty"):
        check_tree([])
    with pytest.raises(ValueError, match="depth 3 needs 3 heads; the heads provide 2"):
        check_tree([[0], [0, 0], [0, 0, 0]], num_heads=2)


# --- acceptance rules --------------------------------------------------------------


def test_accept_tree_greedy_follows_the_argmax_through_a_second_sibling():
    tree = TreeShape.from_choices(canonical_order(SMALL_TREE))
    #            [0] [1] [2] [0,0] [0,1] [1,0] [0,0,0]
    tokens = [4, 6, 8, 1, 2, 3, 9]
    # target: after root -> 6 ([1]), after [1] -> 3 ([1,0]), after [1,0] -> 7 (bonus)
    rows = [6, 0, 3, 0, 0, 0, 7, 0]  # row i + 1 is node i
    path, bonus = accept_tree_greedy(tokens, tree, logits_for(rows))
    assert path == [1, 5] and bonus == 7
    path, bonus = accept_tree_greedy(tokens, tree, logits_for([5, 0, 0, 0, 0, 0, 0, 0]))
    assert path == [] and bonus == 5


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


def test_accept_tree_sampled_keeps_the_target_distribution_with_top_k_children():
    """Three deterministic children (a point-mass draft) under the root: the first output
    token must follow the target's distribution whatever the children are."""
    target = torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.20, 0.10]] + [[1 / 6] * 6] * 3)
    tree = TreeShape((-1, -1, -1))
    tokens = [0, 4, 5]  # a poor guess: the target's likeliest token 1 is missing
    g = torch.Generator().manual_seed(7)
    counts = torch.zeros(6)
    trials = 20000
    for _ in range(trials):
        path, bonus = accept_tree_sampled(tokens, tree, None, target, g)
        counts[tokens[path[0]] if path else bonus] += 1
    assert tv(counts / trials, target[0]) < 0.02


def test_accept_tree_sampled_keeps_the_target_distribution_with_sampled_children():
    q = torch.tensor([0.40, 0.05, 0.30, 0.05, 0.10, 0.10])
    target = torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.20, 0.10]] + [[1 / 6] * 6] * 2)
    tree = TreeShape((-1, -1))
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(6)
    trials = 20000
    draws = torch.multinomial(q, 2 * trials, replacement=True, generator=g).view(trials, 2)
    for tokens in draws.tolist():
        path, bonus = accept_tree_sampled(tokens, tree, q.expand(2, 6), target, g)
        counts[tokens[path[0]] if path else bonus] += 1
    assert tv(counts / trials, target[0]) < 0.02


def test_typical_acceptance_takes_the_longest_accepted_path():
    tree = TreeShape.from_choices(canonical_order(SMALL_TREE))
    tokens = [4, 6, 8, 1, 2, 3, 9]
    probs = torch.full((8, 10), 0.01)
    probs[0, 4] = probs[0, 6] = 0.455  # root: both [0] and [1] are typical
    probs[1, 1] = 0.91  # under [0]: [0,0] typical
    probs[4, 9] = 0.91  # under [0,0]: [0,0,0] typical -> depth 3
    probs[2, 3] = 0.91  # under [1]: [1,0] typical (depth 2 only)
    probs = probs / probs.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(0)
    path, _ = accept_tree_typical(tokens, tree, probs, TypicalAcceptance(), g)
    assert path == [0, 3, 6]
    # an impossible threshold accepts nothing
    path, bonus = accept_tree_typical(
        tokens, tree, probs, TypicalAcceptance(eps=0.95, delta=2.0), g
    )
    assert path == [] and 0 <= bonus < 10


# --- decoding ----------------------------------------------------------------------


class ScriptedTreeDrafter(Drafter):
    """A ternary tree of depth 3 whose true path (the target's own greedy tokens) sits at
    a random rank at each depth, or is missing: exercises acceptance through any sibling
    and the cache compaction that follows."""

    def __init__(self, prompt: list[int], reference: list[int], vocab: int, seed: int):
        self.paths = canonical_order(
            [list(p) for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
        )
        self.tree = TreeShape.from_choices(self.paths)
        self.prompt, self.reference, self.vocab = prompt, reference, vocab
        self.rng = random.Random(seed)
        self.accepted: list[int] = []

    def propose(self, context: DraftContext) -> Draft:
        done = context.position - len(self.prompt) + 1
        truth = self.reference[done : done + 3] + [0, 0, 0]
        true_rank = [self.rng.choice([0, 1, 2, 3]) for _ in range(3)]  # 3: not in the tree
        tokens = [
            (truth[len(p) - 1] + p[-1] - true_rank[len(p) - 1]) % self.vocab for p in self.paths
        ]
        return Draft(tokens, tree=self.tree)

    def observe(self, result: VerifyResult):
        self.accepted.append(result.num_accepted)


def test_tree_decoding_is_lossless_and_accepts_deep_paths(tiny_llama):
    runner = Runner(tiny_llama)
    for seed, prompt in enumerate(PROMPTS):
        reference = decode_plain(runner, prompt, 40).tokens
        drafter = ScriptedTreeDrafter(prompt, reference, tiny_llama.config.vocab_size, seed)
        result = decode_speculative(runner, drafter, prompt, 40)
        assert result.tokens == reference
        assert max(drafter.accepted) == 3
        assert result.tokens_per_step > 1.5


def test_medusa_random_heads_decode_losslessly(tiny_llama, random_heads):
    heads = random_heads(tiny_llama, num_heads=3, seed=1)
    runner = Runner(tiny_llama)
    drafter = MedusaDrafter(heads, [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2], [3]])
    assert drafter.depth == 3
    for prompt in PROMPTS:
        reference = decode_plain(runner, prompt, 30).tokens
        assert decode_speculative(runner, drafter, prompt, 30).tokens == reference


def test_medusa_refuses_a_tree_deeper_than_its_heads(tiny_llama):
    config = tiny_llama.config
    heads = MedusaHeads(config.hidden_size, config.vocab_size, num_heads=2)
    with pytest.raises(TreeTooDeepError, match="depth 3 needs 3 heads; the heads provide 2"):
        MedusaDrafter(heads, [[0], [0, 0], [0, 0, 0]])


def test_tree_sampling_runs_and_is_reproducible(tiny_llama):
    runner = Runner(tiny_llama)
    sampling = SamplingConfig(temperature=0.8, seed=5)
    prompt = PROMPTS[0]
    reference = decode_plain(runner, prompt, 30).tokens
    first = decode_speculative(
        runner, ScriptedTreeDrafter(prompt, reference, 128, 0), prompt, 30, sampling
    )
    again = decode_speculative(
        runner, ScriptedTreeDrafter(prompt, reference, 128, 0), prompt, 30, sampling
    )
    assert first.tokens == again.tokens
    assert len(first.tokens) == 30 or first.tokens[-1] == 2  # 2 is EOS
    typical = decode_speculative(
        runner,
        ScriptedTreeDrafter(prompt, reference, 128, 0),
        prompt,
        30,
        sampling,
        typical=TypicalAcceptance(),
    )
    assert len(typical.tokens) == 30 or typical.tokens[-1] == 2


def test_medusa_heads_fused_into_the_verify_forward_give_the_same_drafts(tiny_llama, random_heads):
    """Heads sharing the target's lm_head get their logits from the verify forward's own
    product: same tokens, same number of steps as computing them separately."""
    heads = random_heads(tiny_llama, num_heads=2, seed=2)
    runner = Runner(tiny_llama)
    tree = [[0], [1], [0, 0], [2]]
    fused, separate = MedusaDrafter(heads, tree), MedusaDrafter(heads, tree, fused=False)
    assert fused.extra_rows(runner) is not None and separate.extra_rows(runner) is None
    for prompt in PROMPTS:
        a = decode_speculative(runner, fused, prompt, 30)
        b = decode_speculative(runner, separate, prompt, 30)
        assert a.tokens == b.tokens == decode_plain(runner, prompt, 30).tokens
        assert (a.steps, a.accepted) == (b.steps, b.accepted)
