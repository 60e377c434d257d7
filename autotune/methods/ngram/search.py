"""Coordinate ascent over a grid of drafter settings: pure, knows nothing of models.

From a start, each setting in turn is tried at every value of its grid, the others held,
and the best value kept; sweeps repeat until one changes nothing (or ``passes`` run out).
The proxy that scores a setting is cheap but not free, so every score is kept: the
finalists are the best settings scored on the way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# Scores closer than this count as equal: the earlier setting (the start's side) stays.
TIE = 1e-9


class Scored:
    """A cache of scores: ``score(setting)`` computed once per setting."""

    def __init__(self, score: Callable[[Any], float]):
        self._score = score
        self.values: dict[Any, float] = {}

    def __call__(self, setting) -> float:
        if setting not in self.values:
            self.values[setting] = self._score(setting)
        return self.values[setting]

    def best(self, count: int) -> list[tuple[Any, float]]:
        """The ``count`` best settings scored so far, best first (ties: first scored)."""
        order = sorted(self.values.items(), key=lambda kv: -kv[1])
        return order[:count]


def ascend(
    start: T,
    grids: Mapping[str, Sequence],
    score: Callable[[T], float],
    passes: int,
    out_of_time: Callable[[], bool] = lambda: False,
) -> T:
    """The best setting coordinate ascent finds from ``start`` (a frozen dataclass whose
    fields the grids name; a value its ``__post_init__`` refuses is skipped)."""
    best, best_score = start, score(start)
    for _ in range(passes):
        moved = False
        for name, values in grids.items():
            for value in values:
                if out_of_time():
                    return best
                try:
                    candidate = dataclasses.replace(best, **{name: value})  # type: ignore[type-var]
                except ValueError:
                    continue
                candidate_score = score(candidate)
                if candidate_score > best_score + TIE:
                    best, best_score, moved = candidate, candidate_score, True
        if not moved:
            break
    return best
