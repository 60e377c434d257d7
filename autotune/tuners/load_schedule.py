"""A method's schedule under load: for each concurrency level, the setting to serve with
that many requests in flight (the tuned one, it with fewer draft tokens, or off), chosen
on search prompts and measured once on held-back prompts (``measure.load``).

Levels run from the lowest up, each chosen and then measured before the next starts, so
that a run cut short by its deadline still holds whole levels; a level is skipped when
the time left is less than the last level took (times the growth in work)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.engine.proposal import Drafter
from autotune.engine.runner import Runner
from autotune.measure.load import (
    OFF,
    TUNED,
    LevelResult,
    crossover,
    in_engine,
    measure_level,
)
from autotune.measure.ties import lossless_up_to_a_tie
from autotune.plan import load_level_runs

GROWTH = 1.6  # a level twice as concurrent took about this much longer on 2 cores


@dataclass
class FittedLevel:
    held: LevelResult  # the held-back rounds: the pick (unless off) and the tuned setting
    pick: str  # the setting chosen on the search rounds, or OFF
    cap: int | None  # its draft-token cap (None: the tuned setting's own; 0: off)


@dataclass
class FittedSchedule:
    levels: list[FittedLevel] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # levels the time left could not fit

    @property
    def crossover(self) -> int | None:
        return crossover({level.held.concurrency: level.pick for level in self.levels})


def fit_schedule(
    runner: Runner,
    makers: dict[str, Callable[[], Drafter]],
    caps: dict[str, int | None],
    search: list[list[int]],
    heldback: list[list[int]],
    max_new_tokens: int,
    levels: list[int],
    rounds: int,
    seconds_left: Callable[[], float | None] = lambda: None,
    first_level_s: float | None = None,
    on_level: Callable[[str], None] | None = None,
    proven: frozenset[int] = frozenset(),
) -> FittedSchedule:
    """The schedule over ``levels`` (ascending) among the settings ``makers`` holds
    (``TUNED`` among them; ``caps``: each one's draft-token cap); ``seconds_left``: the
    time the caller has left (None: no deadline); ``first_level_s``: the caller's estimate
    of the first level's cost (None: the first level runs if any time is left);
    ``proven``: levels where the tuned setting was already shown clearly faster (a
    profile's verdict, one request at a time, whose tuning chose its draft size there on
    more and longer prompts than a level's rounds): there it is kept without a race and
    only measured held back."""
    run_round = in_engine(runner, max_new_tokens, makers)
    same = lossless_up_to_a_tie(runner)
    fitted = FittedSchedule()
    estimate = first_level_s
    for concurrency in sorted(levels):
        left = seconds_left()
        if left is not None and (left <= 0 or (estimate is not None and left < estimate)):
            fitted.skipped.append(concurrency)
            continue
        started, runs = time.monotonic(), 0
        if concurrency in proven:
            pick = TUNED
            if on_level is not None:
                on_level(
                    f"concurrency {concurrency}: tuned, as the verdict proved; measuring it "
                    "held back"
                )
        else:
            if on_level is not None:
                on_level(f"concurrency {concurrency}: choosing among {', '.join(makers)}")
            chosen_on = measure_level(
                run_round,
                list(makers),
                search,
                concurrency,
                rounds,
                _deadline(seconds_left),
                same=same,
            )
            runs += chosen_on.rounds * (1 + len(makers))
            pick = chosen_on.chosen()
            if on_level is not None:
                on_level(f"concurrency {concurrency}: {pick} chosen; measuring it held back")
        names = sorted({pick, TUNED} - {OFF})
        held = measure_level(
            run_round, names, heldback, concurrency, rounds, _deadline(seconds_left), same=same
        )
        runs += held.rounds * (1 + len(names))
        fitted.levels.append(FittedLevel(held, pick, 0 if pick == OFF else caps[pick]))
        # the next level (not proven): each run slower by GROWTH
        per_run = (time.monotonic() - started) / max(runs, 1)
        estimate = per_run * rounds * load_level_runs(len(makers), proven=False) * GROWTH
    return fitted


def _deadline(seconds_left: Callable[[], float | None]) -> float | None:
    left = seconds_left()
    return None if left is None else time.monotonic() + left
