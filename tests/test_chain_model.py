"""The chain-drafting cost model (autotune/tuners/chain_model.py) on hand-made traces."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.measure.costs import LatencyCurve
from autotune.measure.draft_trace import DraftTrace
from autotune.tuners.chain_model import best_static_policy, replay

FLAT = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def trace(matches, confidences=None) -> DraftTrace:
    matches = np.asarray(matches, dtype=bool)
    if confidences is None:
        confidences = np.ones(len(matches))
    return DraftTrace(matches=matches, confidences=np.asarray(confidences, dtype=float))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_all_match_gives_k_plus_one_tokens_per_step(k):
    length = 4 * (k + 1)  # a whole number of steps: no short step at the end
    estimate = replay([trace([True] * length)], k, 0.0, draft_ratio=0.5, verify_relative=FLAT)
    assert estimate.tokens_per_step == pytest.approx(k + 1)
    assert estimate.max_tokens == k and estimate.exit_threshold == 0.0


def test_all_match_short_last_step():
    # 10 tokens with k = 3: steps of 4, 4, then 2 (the trace ends)
    estimate = replay([trace([True] * 10)], 3, 0.0, 0.5, FLAT)
    assert estimate.tokens_per_step == pytest.approx(10 / 3)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_zero_match_gives_one_token_per_step(k):
    estimate = replay([trace([False] * 12)], k, 0.0, 0.5, FLAT)
    assert estimate.tokens_per_step == pytest.approx(1.0)


def test_speedup_by_hand_all_match():
    # 12 tokens, k = 3: three steps, each 3 draft forwards (0.5 each) and a verify of
    # 4 tokens (1.3): cost 3 * (1.5 + 1.3) = 8.4 for 12 tokens -> 12 / 8.4
    verify = [1.0, 1.1, 1.2, 1.3, 1.4]
    estimate = replay([trace([True] * 12)], 3, 0.0, 0.5, verify)
    assert estimate.speedup == pytest.approx(12 / 8.4)
    assert estimate.tokens_per_step == pytest.approx(4.0)


def test_speedup_by_hand_zero_match():
    # every step: 2 draft forwards (0.25 each) + verify of 3 tokens (1.2), 1 token out
    verify = [1.0, 1.1, 1.2]
    estimate = replay([trace([False] * 5)], 2, 0.0, 0.25, verify)
    # the last step only has room for one draft token: 1 forward + verify of 2 tokens
    cost = 4 * (2 * 0.25 + 1.2) + (0.25 + 1.1)
    assert estimate.speedup == pytest.approx(5 / cost)
    assert estimate.speedup < 1.0


def test_speedup_by_hand_mixed_traces():
    # trace A: T T F T  (k = 2)
    #   t=0: draft 2 (T, T) accepted 2 -> 3 tokens; cost 2*0.5 + v(3)=1.2
    #   t=3: one position left: draft 1, accepted 1, produced min(2, 1) = 1; cost 0.5 + v(2)=1.1
    # trace B: F F
    #   t=0: draft 2, accepted 0 -> 1 token; cost 1 + 1.2
    #   t=1: draft 1, accepted 0 -> 1 token; cost 0.5 + 1.1
    verify = [1.0, 1.1, 1.2]
    estimate = replay(
        [trace([True, True, False, True]), trace([False, False])], 2, 0.0, 0.5, verify
    )
    tokens, steps = 6, 4
    cost = (1.0 + 1.2) + (0.5 + 1.1) + (1.0 + 1.2) + (0.5 + 1.1)
    assert estimate.tokens_per_step == pytest.approx(tokens / steps)
    assert estimate.speedup == pytest.approx(tokens / cost)


def test_verify_curve_is_extrapolated_linearly():
    assert LatencyCurve([1.0, 1.5])(2) == 1.5
    assert LatencyCurve([1.0, 1.5])(4) == pytest.approx(2.5)
    # a replay needing a verify of 5 tokens on a 3-point curve uses the extrapolation
    estimate = replay([trace([True] * 5)], 4, 0.0, 0.0, [1.0, 1.25, 1.5])
    assert estimate.speedup == pytest.approx(5 / 2.0)


def test_exit_threshold_stops_drafting_at_low_confidence():
    # confidences: the draft is unsure at positions 2 and 6
    conf = [0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.2, 0.9]
    matches = [True] * 8
    free = replay([trace(matches, conf)], 8, 0.0, 0.5, FLAT)
    capped = replay([trace(matches, conf)], 8, 0.5, 0.5, FLAT)
    # without a threshold: draft all 7 remaining... one step of 8 tokens
    assert free.tokens_per_step == pytest.approx(8.0)
    # with it: t=0 drafts [0, 1], stops at 2 (3 forwards) -> 3 tokens; t=3 drafts [3..5],
    # stops at 6 (4 forwards) -> 4 tokens; t=7 drafts [7] -> 1 token
    assert capped.tokens_per_step == pytest.approx(8 / 3)
    cost = (3 * 0.5 + 1.0) + (4 * 0.5 + 1.0) + (1 * 0.5 + 1.0)
    assert capped.speedup == pytest.approx(8 / cost)


def test_exit_threshold_never_skips_the_first_draft_token():
    conf = [0.01] * 6
    estimate = replay([trace([True] * 6, conf)], 4, 0.9, 0.5, FLAT)
    # one draft token per step (accepted) -> 2 tokens per step; 2 forwards per step
    assert estimate.tokens_per_step == pytest.approx(2.0)
    assert estimate.speedup == pytest.approx(6 / (3 * (2 * 0.5 + 1.0)))


def test_low_confidence_saves_cost_on_wrong_drafts():
    conf = [0.1] * 10
    wrong = [trace([False] * 10, conf)]
    assert (
        replay(wrong, 4, 0.5, 0.5, [1.0, 1.2, 1.4, 1.6, 1.8]).speedup
        > replay(wrong, 4, 0.0, 0.5, [1.0, 1.2, 1.4, 1.6, 1.8]).speedup
    )


def test_best_static_policy_all_match_cheap_verify_drafts_long():
    best = best_static_policy([trace([True] * 40)], 0.2, FLAT, [1, 2, 4, 8], [0.0, 0.5])
    assert best.max_tokens == 8
    assert best.tokens_per_step > 6


def test_best_static_policy_zero_match_drafts_one():
    best = best_static_policy(
        [trace([False] * 40, [0.1] * 40)],
        0.5,
        [1.0, 1.1, 1.2, 1.3, 1.4],
        [1, 2, 4],
        [0.0, 0.5, 0.9],
    )
    assert best.max_tokens == 1 and best.exit_threshold == 0.0
    assert best.speedup == pytest.approx(1 / 1.6)


def test_best_static_policy_returns_grid_maximum():
    traces = [
        trace(
            [True, True, False, True, True, True, False, False, True, True],
            [0.9, 0.8, 0.3, 0.95, 0.9, 0.7, 0.2, 0.4, 0.9, 0.9],
        )
    ]
    verify = [1.0, 1.05, 1.1, 1.2, 1.3, 1.4]
    grid_k, grid_t = [1, 2, 3, 4], [0.0, 0.5, 0.8]
    best = best_static_policy(traces, 0.3, verify, grid_k, grid_t)
    every = [replay(traces, k, t, 0.3, verify) for k in grid_k for t in grid_t]
    assert best.speedup == pytest.approx(max(e.speedup for e in every))
