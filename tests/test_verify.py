"""Acceptance rules (autotune/engine/verify.py) on hand-made logits and probabilities."""

from __future__ import annotations

import pytest
import torch

from autotune.engine.verify import accept_greedy, accept_sampled

V = 6


def logits_for(argmaxes: list[int], vocab: int = V) -> torch.Tensor:
    """One row per entry, each with its argmax at the given token (and a clear margin)."""
    rows = torch.zeros(len(argmaxes), vocab)
    for i, token in enumerate(argmaxes):
        rows[i] = torch.linspace(-1.0, 0.0, vocab)  # some structure besides the argmax
        rows[i, token] = 5.0
    return rows


# --- greedy -------------------------------------------------------------------------


def test_greedy_full_accept_takes_bonus_from_last_row():
    draft = [3, 1, 4]
    target = logits_for([3, 1, 4, 5])  # rows 0..2 agree with the draft, row 3 is the bonus
    assert accept_greedy(draft, target) == (3, 5)


def test_greedy_first_token_mismatch():
    draft = [3, 1, 4]
    target = logits_for([2, 1, 4, 5])
    assert accept_greedy(draft, target) == (0, 2)


@pytest.mark.parametrize("mismatch", [0, 1, 2, 3])
def test_greedy_stops_at_first_mismatch_and_returns_correction(mismatch):
    draft = [0, 1, 2, 3]
    wanted = list(draft) + [4]
    wanted[mismatch] = 5  # the target wants token 5 where the draft said draft[mismatch]
    # later rows agreeing again must not extend the accepted prefix
    accepted, bonus = accept_greedy(draft, logits_for(wanted))
    assert accepted == mismatch
    assert bonus == 5


def test_greedy_empty_draft_gives_target_token():
    assert accept_greedy([], logits_for([4])) == (0, 4)


def test_greedy_uses_argmax_not_first_row_value():
    # a draft token that is second best is rejected even when close
    target = torch.tensor([[0.0, 1.0, 1.001, 0, 0, 0], [0, 0, 0, 0, 0, 9.0]])
    assert accept_greedy([1], target) == (0, 2)
    assert accept_greedy([2], target) == (1, 5)


# --- sampled: deterministic corner cases --------------------------------------------


def one_hot(tokens: list[int], vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_sampled_certain_target_agreeing_draft_accepts_all_and_bonus_from_last_row():
    draft = [2, 0]
    draft_probs = one_hot(draft)
    target_probs = one_hot([2, 0, 5])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert accept_sampled(draft, draft_probs, target_probs, g) == (2, 5)


def test_sampled_zero_target_probability_rejects_and_resamples_from_residual():
    draft = [1, 3]
    draft_probs = torch.full((2, V), 1.0 / V)
    target_probs = torch.zeros(3, V)
    target_probs[0, 4] = 1.0  # the target never says 1 here: always rejected
    target_probs[1:, 0] = 1.0
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert accept_sampled(draft, draft_probs, target_probs, g) == (0, 4)


def test_sampled_identical_distributions_always_accept():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(3, V), dim=-1)
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        draft = [int(torch.multinomial(probs[i], 1, generator=g)) for i in range(2)]
        accepted, bonus = accept_sampled(draft, probs[:2], probs, g)
        assert accepted == 2
        assert 0 <= bonus < V


# --- sampled: statistics ------------------------------------------------------------


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


def test_accept_sampled_preserves_target_distribution():
    """Draft k=2 tokens from a known draft distribution; the output must follow the target.

    Both rows of the target do not depend on the prefix here, so the first output token
    must be distributed as target_probs[0], and, when the first draft token was accepted,
    the second output token as target_probs[1].
    """
    trials = 20000
    draft_probs = torch.tensor(
        [
            [0.40, 0.30, 0.10, 0.10, 0.05, 0.05],
            [0.05, 0.05, 0.10, 0.20, 0.30, 0.30],
        ]
    )
    target_probs = torch.tensor(
        [
            [0.10, 0.15, 0.35, 0.05, 0.25, 0.10],
            [0.30, 0.05, 0.05, 0.30, 0.10, 0.20],
            [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
        ]
    )
    # the test can only detect a broken rule if draft and target differ a lot
    assert tv(draft_probs[0], target_probs[0]) > 0.3
    assert tv(draft_probs[1], target_probs[1]) > 0.3

    g_draft = torch.Generator().manual_seed(123)
    g_accept = torch.Generator().manual_seed(456)
    draws = torch.multinomial(draft_probs, trials, replacement=True, generator=g_draft).T
    first = torch.zeros(V)
    second_given_accept = torch.zeros(V)
    accept_counts = [0, 0, 0]
    for tokens in draws.tolist():
        accepted, bonus = accept_sampled(tokens, draft_probs, target_probs, g_accept)
        assert 0 <= accepted <= 2
        out = tokens[:accepted] + [bonus]
        first[out[0]] += 1
        if accepted >= 1:
            second_given_accept[out[1]] += 1
        accept_counts[accepted] += 1

    assert tv(first / trials, target_probs[0]) < 0.03
    n2 = second_given_accept.sum()
    assert n2 > 3000
    assert tv(second_given_accept / n2, target_probs[1]) < 0.05
    # P(accept first) = sum_x min(p(x), q(x)) = 1 - TV(p, q)
    expected_accept = 1 - tv(draft_probs[0], target_probs[0])
    assert abs((accept_counts[1] + accept_counts[2]) / trials - expected_accept) < 0.02
