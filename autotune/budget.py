"""Time budgets: a deadline, and shares of what is left of it."""

from __future__ import annotations

import sys
import time
from pathlib import Path


class Budget:
    """``seconds`` from now, or from ``started`` (a ``time.monotonic`` instant; None: no
    limit), the last ``reserve`` of them kept back from what is ``left()`` (for what must
    still happen after the work it times: writing, reporting, exiting). ``within``: the
    run's deadline this share of it lies in, which no work may pass, not even the least
    a phase does once its own share is spent."""

    def __init__(
        self,
        seconds: float | None,
        started: float | None = None,
        reserve: float = 0.0,
        within: Budget | None = None,
    ):
        self.seconds = seconds
        self.started = time.monotonic() if started is None else started
        self.reserve = reserve
        self.within = within

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float | None:
        if self.seconds is None:
            return None
        return max(0.0, self.seconds - self.reserve - self.elapsed())

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0

    def share(self, fraction: float, floor: float = 1.0) -> float | None:
        """``fraction`` of what is left, at least ``floor`` seconds (None: no limit)."""
        left = self.left()
        return None if left is None else max(floor, fraction * left)

    def part(self, fraction: float, floor: float = 1.0) -> Budget:
        """A budget of ``fraction`` of what is left, starting now, within this one's
        deadline (or within this one)."""
        return Budget(self.share(fraction, floor), within=self.within or self)


def command_started() -> float:
    """When the command began, on ``time.monotonic``'s clock: its process's start where
    the process was started to run it (the ``autotune`` script), else now (a command
    called within a longer-lived process: a test, a notebook)."""
    if Path(sys.argv[0]).name == "autotune":
        return process_started()
    return time.monotonic()


def process_started() -> float:
    """When this process started, on ``time.monotonic``'s clock: a command's budget counts
    its imports and checks too (beside two busy processes, 15 s went by before the run's
    own clock started, and the command ended 39 s past a 5-minute --budget)."""
    import psutil

    age = time.time() - psutil.Process().create_time()
    return time.monotonic() - max(0.0, age)
