"""The time plan of one run: its phases with the seconds each is given, printed at the
start; each phase, as it begins, gets its share of what is really left and says when
the whole run should end."""

from __future__ import annotations

import time
from dataclasses import dataclass

from autotune.budget import Budget
from autotune.errors import AutotuneError


@dataclass
class Phase:
    name: str
    seconds: float  # planned
    why: str = ""  # how the figure was reached, for the printed plan
    # kept whole while other phases ahead can give up time (the final measurements: a run
    # that overran in its searches still measures what it reports on enough prompts)
    reserved: bool = False
    count: int | None = None  # what the seconds were planned for (prompts), where it counts


def parse_duration(text: str, option: str = "--budget") -> float:
    """A duration option (``--budget``, ``--time-budget``, ``--tune``): ``20m``, ``1h``,
    ``90s`` or plain seconds. A bad one is refused naming ``option`` and the syntax."""
    units = {"s": 1, "m": 60, "h": 3600}
    value = text.strip().lower()
    scale = units.get(value[-1:])
    number = value[:-1] if scale else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise AutotuneError(
            f"{option} {text!r} is not a duration: write it like 20m, 1h or 900s"
        ) from None
    if seconds <= 0:
        raise AutotuneError(f"{option} {text!r}: give a positive duration")
    return seconds


def clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Schedule:
    """Phases run in order within ``budget``; a phase that starts late gets its planned
    share of the time that is left, so the run shrinks instead of overrunning. Reserved
    phases shrink last: the others ahead give up their time first."""

    def __init__(self, budget: Budget, phases: list[Phase], done: int = 0):
        self.budget = budget
        self.phases = phases
        self.before = done  # phases of the run already over (a plan made again midway)
        self._done: set[str] = set()

    def lines(self) -> list[str]:
        total = sum(p.seconds for p in self.phases)
        lines = [f"plan: {len(self.phases)} phases, ~{clock(total)} (m:s)"]
        for i, phase in enumerate(self.phases, 1):
            why = f"  ({phase.why})" if phase.why else ""
            lines.append(f"  {i}. {phase.name:<34} ~{clock(phase.seconds):>6}{why}")
        return lines

    def planned(self, name: str) -> Phase:
        return self._phase(name)

    def begin(self, name: str) -> Budget:
        """The budget of the phase ``name``, which starts now, and one line with the run's
        expected end."""
        from autotune.progress import say

        phase = self._phase(name)
        ahead = [p for p in self.phases if p.name not in self._done]
        self._done.add(name)
        planned_ahead = sum(p.seconds for p in ahead) or 1.0
        left = self.budget.left()
        seconds = phase.seconds * (1.0 if left is None else self._scale(phase, ahead, left))
        expected = planned_ahead if left is None else min(planned_ahead, max(left, 0.0))
        end = time.strftime("%H:%M", time.localtime(time.time() + expected))
        index = self.before + self.phases.index(phase) + 1
        say(
            f"[bold][{index}/{self.before + len(self.phases)}] {name}[/bold] (~{clock(seconds)}; "
            f"{clock(self.budget.elapsed())} so far, the run should end by {end})"
        )
        if left is not None and left <= 0:
            say(
                f"[yellow]the budget is spent ({clock(self.budget.elapsed())} of "
                f"{clock(self.budget.seconds or 0)}): {name} does only its least; give more "
                "--budget for a fuller run[/yellow]"
            )
        return Budget(seconds, within=self.budget)

    @staticmethod
    def _scale(phase: Phase, ahead: list[Phase], left: float) -> float:
        """The share of its planned time that ``phase`` gets, with ``left`` seconds for
        it and the phases ``ahead`` (itself included)."""
        reserved = sum(p.seconds for p in ahead if p.reserved)
        flexible = sum(p.seconds for p in ahead if not p.reserved)
        if phase.reserved:  # what is left, shared in proportion (as every phase once was)
            share = left / ((reserved + flexible) or 1.0)
        else:  # what the reserved phases ahead leave
            share = (left - reserved) / (flexible or 1.0)
        return max(0.0, min(1.0, share))

    def _phase(self, name: str) -> Phase:
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise KeyError(name)
