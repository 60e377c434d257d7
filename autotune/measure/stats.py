"""Paired statistics of a speedup measured prompt by prompt. Pure functions (numpy only).

A method and plain greedy decoding are timed on the same prompts; a prompt's pair is
(method seconds, method tokens, baseline seconds, baseline tokens). The speedup is the
ratio of throughputs over all prompts,

    speedup = (sum m_tokens / sum m_seconds) / (sum b_tokens / sum b_seconds),

which for lossless greedy decoding (equal tokens) is the ratio of total times. Its
confidence interval comes from a paired bootstrap over prompts: whole prompts are drawn
with replacement, both of a prompt's timings together, so that what a prompt costs (its
length, its difficulty) cancels and only the method's effect and the noise remain.

Sequential measurement looks at the interval after each batch of prompts and stops as
soon as it decides; each of the ``looks`` planned looks is made at confidence
``1 - (1 - confidence) / looks`` (Bonferroni), so that the chance of any look deciding
wrongly stays within ``1 - confidence``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000  # bootstrap resamples: the interval's ends move by < 0.2% past this
MIN_PROMPTS = 6  # fewer prompts than this give no interval worth reporting


@dataclass(frozen=True)
class Pairs:
    """Per prompt: the method's and the baseline's seconds and tokens."""

    method_seconds: np.ndarray
    method_tokens: np.ndarray
    baseline_seconds: np.ndarray
    baseline_tokens: np.ndarray

    @classmethod
    def of(cls, rows) -> Pairs:
        """From (method seconds, method tokens, baseline seconds, baseline tokens) rows."""
        array = np.asarray(list(rows), dtype=float).reshape(-1, 4)
        return cls(array[:, 0], array[:, 1], array[:, 2], array[:, 3])

    def __len__(self) -> int:
        return len(self.method_seconds)

    def speedup(self) -> float:
        return _ratio(
            self.method_seconds.sum(),
            self.method_tokens.sum(),
            self.baseline_seconds.sum(),
            self.baseline_tokens.sum(),
        )


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float  # of this interval alone (looks taken into account)
    prompts: int

    def above(self, bound: float) -> bool:
        return self.low > bound

    def below(self, bound: float) -> bool:
        return self.high < bound

    def decides(self, bound: float) -> bool:
        """Whether the interval lies wholly on one side of ``bound``."""
        return self.above(bound) or self.below(bound)

    def as_list(self) -> list[float]:
        return [round(self.low, 4), round(self.high, 4)]


def _ratio(method_s, method_tok, base_s, base_tok):
    return (method_tok / np.maximum(method_s, 1e-12)) / np.maximum(
        base_tok / np.maximum(base_s, 1e-12), 1e-12
    )


def bootstrap_interval(
    pairs: Pairs, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """The percentile interval of the speedup over ``resamples`` paired resamples of the
    prompts (deterministic for a seed). With one prompt the interval is that prompt's
    speedup alone: there is no spread to resample."""
    count = len(pairs)
    if count == 0:
        raise ValueError("no prompts measured: nothing to bootstrap")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, count, size=(resamples, count))
    columns = (
        pairs.method_seconds,
        pairs.method_tokens,
        pairs.baseline_seconds,
        pairs.baseline_tokens,
    )
    sums = [column[draws].sum(axis=1) for column in columns]
    ratios = _ratio(*sums)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return Interval(float(low), float(high), confidence, count)


def look_confidence(confidence: float, looks: int) -> float:
    """The confidence of each of ``looks`` planned looks (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / max(1, looks)


def planned_looks(prompts: int, first: int, every: int) -> int:
    """How many looks a sequential measurement of at most ``prompts`` prompts takes, the
    first after ``first`` prompts and then every ``every``."""
    if prompts <= first:
        return 1
    return 1 + -(-(prompts - first) // every)


def robust_spread(values) -> float:
    """The median absolute deviation over the median (0 for fewer than 2 values): how
    much repeated timings of one thing vary, unmoved by a single outlier."""
    values = np.asarray(list(values), dtype=float)
    if len(values) < 2:
        return 0.0
    median = float(np.median(values))
    return float(np.median(np.abs(values - median)) / max(abs(median), 1e-12))
