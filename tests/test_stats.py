"""The paired statistics of a speedup, on data whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.measure.stats import (
    Pairs,
    bootstrap_interval,
    look_confidence,
    planned_looks,
    robust_spread,
)


def pairs(method_s, base_s, tokens=100):
    n = len(method_s)
    return Pairs(
        np.asarray(method_s, float),
        np.full(n, tokens, float),
        np.asarray(base_s, float),
        np.full(n, tokens, float),
    )


def test_speedup_is_the_ratio_of_total_times():
    # prompt costs differ (2 s and 6 s plainly); the method halves one, keeps the other
    data = pairs([1.0, 6.0], [2.0, 6.0])
    assert data.speedup() == pytest.approx(8.0 / 7.0)
    # tokens weigh: a method that emits half the tokens in the same time is half as fast
    half = Pairs(np.array([1.0]), np.array([50.0]), np.array([1.0]), np.array([100.0]))
    assert half.speedup() == pytest.approx(0.5)


def test_a_constant_ratio_has_a_point_interval():
    base = np.linspace(1.0, 9.0, 20)  # prompts of very different lengths
    interval = bootstrap_interval(pairs(base / 2.0, base))
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)
    assert interval.prompts == 20 and interval.confidence == 0.95


def test_pairing_cancels_what_a_prompt_costs():
    """Prompt lengths spread 1..100 s, the method saves 20% on each with 2% noise: the
    paired interval is narrow; an unpaired one would be as wide as the lengths' spread."""
    rng = np.random.default_rng(1)
    base = rng.uniform(1.0, 100.0, 40)
    method = base / 1.25 * rng.normal(1.0, 0.02, 40)
    interval = bootstrap_interval(pairs(method, base))
    assert interval.low < 1.25 < interval.high
    assert interval.high - interval.low < 0.05


def test_interval_covers_the_true_ratio_at_its_confidence():
    """Coverage over many simulated measurements (a 15% gain with 10% noise per prompt):
    close to 95%, and not far above it (an interval needlessly wide hides a real gain)."""
    rng = np.random.default_rng(0)
    truth, hits, trials = 1.15, 0, 300
    for t in range(trials):
        base = rng.uniform(2.0, 6.0, 24)
        method = base / truth * rng.lognormal(0.0, 0.10, 24)
        # the truth of a finite sample: the ratio its noise would average to
        interval = bootstrap_interval(pairs(method, base), resamples=1000, seed=t)
        hits += interval.low <= truth <= interval.high
    assert 0.88 <= hits / trials <= 0.99


def test_interval_narrows_with_more_prompts_and_is_repeatable():
    rng = np.random.default_rng(3)
    widths = []
    for n in (8, 32, 128):
        base = rng.uniform(2.0, 6.0, n)
        method = base / 1.1 * rng.lognormal(0.0, 0.1, n)
        a = bootstrap_interval(pairs(method, base), seed=5)
        b = bootstrap_interval(pairs(method, base), seed=5)
        assert (a.low, a.high) == (b.low, b.high)
        widths.append(a.high - a.low)
    assert widths[0] > widths[1] > widths[2]


def test_decisions_against_a_bound():
    interval = bootstrap_interval(pairs([1.0] * 10, [1.2] * 10))  # exactly 1.2x
    assert interval.above(1.1) and interval.decides(1.1) and not interval.below(1.1)
    assert interval.below(1.3) and interval.decides(1.3) and not interval.above(1.3)
    assert not interval.decides(1.2)


def test_sequential_looks():
    assert planned_looks(8, first=8, every=4) == 1
    assert planned_looks(30, first=8, every=4) == 1 + 6
    assert look_confidence(0.95, 1) == pytest.approx(0.95)
    assert look_confidence(0.95, 5) == pytest.approx(0.99)
    # a look at the adjusted confidence is wider than one at 95%
    rng = np.random.default_rng(2)
    base = rng.uniform(2, 6, 20)
    data = pairs(base / 1.1 * rng.lognormal(0, 0.1, 20), base)
    narrow, wide = (
        bootstrap_interval(data, 0.95),
        bootstrap_interval(data, look_confidence(0.95, 5)),
    )
    assert wide.low < narrow.low and wide.high > narrow.high


def test_no_prompt_is_an_error_and_one_prompt_a_point():
    with pytest.raises(ValueError):
        bootstrap_interval(pairs([], []))
    one = bootstrap_interval(pairs([1.0], [3.0]))
    assert one.low == one.high == pytest.approx(3.0)


def test_robust_spread_ignores_one_outlier():
    assert robust_spread([10.0] * 9 + [100.0]) == 0.0
    assert robust_spread([9.0, 10.0, 11.0]) == pytest.approx(0.1)
    assert robust_spread([5.0]) == 0.0
