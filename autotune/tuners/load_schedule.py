"""A method's schedule under load: for each concurrency level, the setting to serve with
that many requests in flight (the tuned one, it with fewer draft tokens, or off), chosen
on search prompts and measured once on held-back prompts (``measure.load``).

Levels run from the lowest up, each chosen and then measured before the next starts, so
that a run cut short by its deadline still holds whole levels; a level is skipped when
the time left is less than the last level took (times the growth in work)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autotune.engine.runner import Runner
from autotune.measure.load import (
    OFF,
    TUNED,
    LevelResult,
    crossover,
    in_engine,
    load_candidates,
    measure_level,
)
from autotune.methods.base import DraftEnv, Method
from autotune.profile.blocks import Load, LoadLevel

GROWTH = 1.6  # a level twice as concurrent took about this much longer on 2 cores


def fit_schedule(
    runner: Runner,
    method: Method,
    settings: Any,
    env: DraftEnv,
    search: list[list[int]],
    heldback: list[list[int]],
    max_new_tokens: int,
    levels: list[int],
    rounds: int,
    seconds_left: Callable[[], float | None] = lambda: None,
    first_level_s: float | None = None,
    on_level: Callable[[str], None] | None = None,
) -> Load:
    """The schedule over ``levels`` (ascending); ``seconds_left``: the time the caller
    has left (None: no deadline); ``first_level_s``: the caller's estimate of the first
    level's cost (None: the first level always runs)."""
    candidates = load_candidates(method, settings)
    makers = {label: method.variant(c.settings, env).make for label, c in candidates.items()}
    measured: list[LoadLevel] = []
    skipped: list[int] = []
    estimate = first_level_s
    for concurrency in sorted(levels):
        left = seconds_left()
        if left is not None and estimate is not None and left < estimate:
            skipped.append(concurrency)
            continue
        started = time.monotonic()
        if on_level is not None:
            on_level(f"concurrency {concurrency}: choosing among {', '.join(makers)}")
        run_round = in_engine(runner, max_new_tokens, makers)
        chosen_on = measure_level(
            run_round, list(makers), search, concurrency, rounds, _deadline(seconds_left)
        )
        pick = chosen_on.chosen()
        names = sorted({pick, TUNED} - {OFF})
        if on_level is not None:
            on_level(f"concurrency {concurrency}: {pick} chosen; measuring it held back")
        held = measure_level(
            run_round, names, heldback, concurrency, rounds, _deadline(seconds_left)
        )
        cap = 0 if pick == OFF else candidates[pick].cap
        measured.append(level_block(held, pick, cap))
        estimate = (time.monotonic() - started) * GROWTH
    schedule = {level.concurrency: level.setting for level in measured}
    return Load(
        levels=measured,
        crossover=crossover(schedule),
        skipped=skipped,
        max_new_tokens=max_new_tokens,
    )


def level_block(held: LevelResult, pick: str, cap: int | None) -> LoadLevel:
    """One level's profile block: the pick's held-back figures (off: plain decoding's
    own, a speedup of exactly 1) beside the tuned setting's."""
    tuned = held.figures[TUNED]
    figure = held.figures.get(pick)
    common = {
        "concurrency": held.concurrency,
        "setting": pick,
        "max_draft_tokens": cap,
        "baseline_tokens_per_s": round(tuned.plain_tokens_per_s, 2),
        "baseline_latency_s": round(tuned.plain_latency_s, 3),
        "tuned_speedup": round(tuned.speedup, 4),
        "tuned_interval": tuned.interval.as_list(),
        "rounds": held.rounds,
    }
    if figure is None:  # off
        return LoadLevel(
            **common,
            speedup=1.0,
            tokens_per_s=round(tuned.plain_tokens_per_s, 2),
            latency_s=round(tuned.plain_latency_s, 3),
            lossless=True,
        )
    return LoadLevel(
        **common,
        speedup=round(figure.speedup, 4),
        speedup_interval=figure.interval.as_list(),
        tokens_per_s=round(figure.tokens_per_s, 2),
        latency_s=round(figure.latency_s, 3),
        lossless=figure.lossless and tuned.lossless,
    )


def _deadline(seconds_left: Callable[[], float | None]) -> float | None:
    left = seconds_left()
    return None if left is None else time.monotonic() + left
