"""Time budgets: a deadline, and shares of what is left of it."""

from __future__ import annotations

import time


class Budget:
    """``seconds`` from now (None: no limit)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float | None:
        return None if self.seconds is None else max(0.0, self.seconds - self.elapsed())

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0

    def share(self, fraction: float, floor: float = 1.0) -> float | None:
        """``fraction`` of what is left, at least ``floor`` seconds (None: no limit)."""
        left = self.left()
        return None if left is None else max(floor, fraction * left)

    def part(self, fraction: float, floor: float = 1.0) -> Budget:
        """A budget of ``fraction`` of what is left, starting now."""
        return Budget(self.share(fraction, floor))
