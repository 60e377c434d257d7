"""Measuring until the figures decide: held-back prompts in batches, looking at the
interval of one candidate after each, and stopping once it lies wholly above or below the
bound (or the prompts or the time run out). The looks are planned up front and every
interval allows for all of them (``measure.stats.look_confidence``), so stopping early
does not make a lucky interval look surer than it is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.budget import Budget
from autotune.measure.stats import MIN_PROMPTS, planned_looks
from autotune.measure.timing import EncodedPrompt, Measurement, PromptMeasurement, SideBySide

# prompts before the first look: a bootstrap over fewer says little (when the time is
# short the first look takes fewer, down to stats.MIN_PROMPTS). 12, not 8: verdicts decided
# at 8 prompts spanned [1.03, 1.53] while the runs ended 1-1.5 minutes before their budget,
# and 4 more prompts of one method and greedy take about 15 s on 2 cores
FIRST_LOOK = 12
EVERY = 4  # prompts between later looks


@dataclass
class Sequential:
    measurements: dict[str, Measurement]
    looks: int  # looks taken
    planned: int  # looks planned (what every interval allows for)
    stopped: str  # why it stopped: "decided", "no candidate", "prompts", "time"


def measure_until_decided(
    session: SideBySide,
    prompts: Sequence[EncodedPrompt],
    candidate: str | None,
    bound: float,
    budget: Budget | None = None,
    between: Callable[[], None] | None = None,
    on_prompt: Callable[[PromptMeasurement], None] | None = None,
    first: int = FIRST_LOOK,
    every: int = EVERY,
    deadline: Budget | None = None,
) -> Sequential:
    """Measure ``prompts`` in batches with ``session`` until ``candidate``'s interval
    decides against ``bound``. With no candidate (nothing to decide) one batch is measured,
    for the report. ``between()`` runs after each batch (a noise probe). ``deadline``, the
    whole run's: once it is spent no prompt starts but the first, whatever the least."""
    first = max(first, min(MIN_PROMPTS, len(prompts)))
    planned = planned_looks(len(prompts), first, every)
    for measurement in session.measurements.values():
        measurement.looks = planned
    done = looks = 0
    stopped = "prompts"
    while done < len(prompts):
        batch = prompts[done : done + (first if looks == 0 else every)]
        # the first look fits the time down to the least prompts an interval needs; a
        # later one stops at the deadline, however few of its batch it measured
        least = MIN_PROMPTS if looks == 0 else 0
        measured = session.measure(batch, on_prompt, until=budget, least=least, deadline=deadline)
        done, looks = done + measured, looks + 1
        if between is not None:
            between()
        if candidate is None:
            stopped = "no candidate"
            break
        enough = done >= min(MIN_PROMPTS, len(prompts))  # fewer decide nothing
        if enough and session.measurements[candidate].interval().decides(bound):
            stopped = "decided"
            break
        if (budget is not None and budget.spent()) or (deadline is not None and deadline.spent()):
            stopped = "time"
            break
    return Sequential(session.measurements, looks, planned, stopped)
