"""Racing the final candidates on search prompts: every candidate and plain greedy decoded
side by side in rounds; after each round a candidate clearly slower than the leader (a
paired comparison on the same prompts) or than the bar over greedy is dropped and
decodes no more. The race ends when one candidate is left, or the prompts or the time
run out; what is left goes on to the held-back measurement.

The looks are planned up front, and each comparison is made at the confidence that
allows for all of them: the looks times the candidates compared with the leader at each
(Bonferroni), so that dropping on an early, lucky round is no likelier than the stated
error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autotune.budget import Budget
from autotune.measure.stats import (
    CONFIDENCE,
    MIN_PROMPTS,
    Interval,
    Pairs,
    bootstrap_interval,
    look_confidence,
    planned_looks,
)
from autotune.measure.timing import EncodedPrompt, Measurement, PromptMeasurement, SideBySide

FIRST_ROUND = MIN_PROMPTS  # prompts before the first look: fewer say little
EVERY = 2  # prompts between later looks: a dropped candidate stops costing soon


@dataclass
class Race:
    measurements: dict[str, Measurement]
    alive: list[str]  # still in the race when it ended, fastest first
    dropped: dict[str, str] = field(default_factory=dict)  # name -> why, in words
    looks: int = 0
    stopped: str = ""  # "decided" (one left), "none left", "prompts", "time"


def against(candidate: Measurement, leader: Measurement) -> Pairs:
    """The candidate timed against the leader on the prompts both decoded: its speed
    relative to the leader's, prompt by prompt."""
    leader_by_prompt = {p.prompt_id: p for p in leader.prompts}
    return Pairs.of(
        (p.method_seconds, p.method_tokens, q.method_seconds, q.method_tokens)
        for p in candidate.prompts
        if (q := leader_by_prompt.get(p.prompt_id)) is not None
    )


def race(
    session: SideBySide,
    prompts: Sequence[EncodedPrompt],
    bound: float,
    budget: Budget | None = None,
    between: Callable[[], None] | None = None,
    on_prompt: Callable[[PromptMeasurement], None] | None = None,
    first: int = FIRST_ROUND,
    every: int = EVERY,
) -> Race:
    """Race ``session``'s candidates over ``prompts``: a candidate whose interval against
    the leader lies below 1, or whose speedup's interval lies below ``bound``, is dropped."""
    names = list(session.variants)
    first = max(1, min(first, len(prompts)))
    planned = planned_looks(len(prompts), first, every)
    for measurement in session.measurements.values():
        measurement.looks = planned  # each one's own interval allows for every look
    confidence = look_confidence(CONFIDENCE, planned * max(1, len(names) - 1))
    result = Race(session.measurements, list(names))
    done = 0
    result.stopped = "prompts"
    while done < len(prompts) and result.alive:
        batch = prompts[done : done + (first if result.looks == 0 else every)]
        # one prompt at least (figures to rank by), not an interval's 6: the race is
        # optional, and its time is the held-back measurement's (beside three CPU hogs
        # its first 6 prompts took 4:31 of a 1:07 share)
        measured = session.measure(batch, on_prompt, until=budget, least=int(result.looks == 0))
        done, result.looks = done + measured, result.looks + 1
        if between is not None:
            between()
        if measured:
            _drop_the_slow(session, result, bound, confidence)
        if len(result.alive) <= 1:
            result.stopped = "decided" if result.alive else "none left"
            break
        if budget is not None and budget.spent():
            result.stopped = "time"
            break
    result.alive.sort(key=lambda n: -session.measurements[n].speedup)
    return result


def _drop_the_slow(session: SideBySide, result: Race, bound: float, confidence: float) -> None:
    measurements = session.measurements
    leader = max(result.alive, key=lambda n: measurements[n].speedup)
    for name in list(result.alive):
        if len(measurements[name].prompts) < MIN_PROMPTS:
            continue  # a bootstrap over fewer says little: no one leaves on it
        own = bootstrap_interval(measurements[name].pairs(), confidence)
        if own.below(bound):
            why = f"{_text(measurements[name].speedup, own)} over greedy, below {bound:.2f}"
        elif name != leader and (
            vs := _versus(measurements[name], measurements[leader], confidence)
        ):
            why = vs + f" of {leader}'s speed"
        else:
            continue
        result.alive.remove(name)
        result.dropped[name] = f"{why}, after {len(measurements[name].prompts)} search prompts"
        session.drop(name)


def _versus(candidate: Measurement, leader: Measurement, confidence: float) -> str | None:
    pairs = against(candidate, leader)
    if len(pairs) < MIN_PROMPTS:
        return None
    interval = bootstrap_interval(pairs, confidence)
    return _text(pairs.speedup(), interval) if interval.below(1.0) else None


def _text(ratio: float, interval: Interval) -> str:
    return f"{ratio:.3f}x [{interval.low:.3f}, {interval.high:.3f}]"
