"""One profile run's state, and the bookkeeping of its phases.

A phase is a function from a ``RunState`` to a new one: nothing here is changed in
place. Before each phase the plan is made again from what is known
(``autotune.plan.phases``): ``begin`` gives the phase its share of the time left (and
probes the machine), ``end`` records in the ledger what it was planned, what it spent
and what it bought."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from autotune import plan
from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.measure.noise import NoiseRecord, Reading, probe
from autotune.profiling.request import Tuning
from autotune.profiling.setup import Setup
from autotune.progress import say
from autotune.schedule import Schedule, clock
from autotune.workspace import Workspace

P = ParamSpec("P")
T = TypeVar("T")

# Forwards in the machine check before each phase: enough to see a hog (with the others'
# load), few enough that fifteen checks cost seconds, not minutes.
PHASE_PROBE_FORWARDS = 6


@dataclass(frozen=True)
class RunState:
    """What a run knows between phases: its inputs, the plan's facts, what it has
    learned (``evidence``), the machine's readings, the heads it drafts with and the
    ledger of its phases."""

    setup: Setup
    ws: Workspace
    tuning: Tuning
    budget: Budget
    facts: plan.Facts
    evidence: plan.Evidence
    noise: NoiseRecord
    heads: Mapping[str, Path]
    ledger: tuple[dict, ...] = ()


@dataclass(frozen=True)
class OpenPhase:
    """A phase begun: its share of the time and what ``end`` records of it."""

    name: str
    budget: Budget
    planned_s: float
    started_s: float  # the run's clock when it began
    busy: tuple[str, ...] = ()  # why the machine was busy when it began


def seconds_left(run: RunState) -> float:
    left = run.budget.left()
    return plan.NO_BUDGET_S if left is None else left


def schedule(run: RunState) -> Schedule:
    return Schedule(
        run.budget,
        plan.phases(run.facts, run.evidence, seconds_left(run)),
        done=len(run.ledger),
    )


def planned(run: RunState, name: str) -> float:
    """The seconds the plan made now gives phase ``name`` (0 when it has none)."""
    return next((p.seconds for p in schedule(run).phases if p.name == name), 0.0)


def left_over(run: RunState) -> float:
    """The seconds the plan made now leaves to no phase still to run: what a phase
    outside the plan that takes the time left (``phase(..., leftover=True)``) may spend.
    (The plan lists the measuring phases whether or not they ran: the ledger says.)"""
    ahead = [p for p in schedule(run).phases if p.name not in run.evidence.done]
    return max(0.0, seconds_left(run) - sum(p.seconds for p in ahead))


def begin(run: RunState, name: str, leftover: bool = False) -> tuple[RunState, OpenPhase]:
    """The phase ``name`` starts: its share of the time left, from a fresh plan, and the
    machine probed (a machine that became busy is said when it happens). ``leftover``:
    the phase is outside the plan and takes what the plan leaves (``left_over``), which
    the ledger records as its planned time."""
    try:
        share = schedule(run).begin(name)
        planned_s = share.seconds or 0.0
    except KeyError:  # not in the plan (any more: e.g. its time is gone): its least
        share, planned_s = Budget(0.0), left_over(run) if leftover else 0.0
    started = run.budget.elapsed()
    reading = probe(run.ws.runner, forwards=PHASE_PROBE_FORWARDS)
    if reading.busy and not run.noise.busy:
        say(
            f"[yellow]the machine became busy before {name} "
            f"({'; '.join(reading.reasons)}): its figures are taken on a busy machine, "
            "and the profile records it[/yellow]"
        )
    phase = OpenPhase(name, share, planned_s, started, tuple(reading.reasons))
    return with_readings(run, [reading]), phase


def end(run: RunState, phase: OpenPhase, bought: str) -> RunState:
    row = {
        "phase": phase.name,
        "planned_s": round(phase.planned_s, 1),
        "spent_s": round(run.budget.elapsed() - phase.started_s, 1),
        "bought": bought,
        **({"busy": "; ".join(phase.busy)} if phase.busy else {}),
    }
    evidence = dataclasses.replace(run.evidence, done=run.evidence.done | {phase.name})
    return dataclasses.replace(run, ledger=(*run.ledger, row), evidence=evidence)


def phase(
    name_of: Callable[Concatenate[RunState, P], str], leftover: bool = False
) -> Callable[
    [Callable[Concatenate[RunState, Budget, P], tuple[RunState, T, str]]],
    Callable[Concatenate[RunState, P], tuple[RunState, T]],
]:
    """A phase of the run: ``work(run, budget, *args)`` returns the new state, its result
    and what it bought; the phase named ``name_of(run, *args)`` is begun before it (its share
    of the time, the machine probed) and recorded in the ledger after it. ``leftover``:
    outside the plan, it takes the time the plan leaves (``begin``)."""

    def timed(
        work: Callable[Concatenate[RunState, Budget, P], tuple[RunState, T, str]],
    ) -> Callable[Concatenate[RunState, P], tuple[RunState, T]]:
        @functools.wraps(work)
        def run_phase(run: RunState, *args: P.args, **kwargs: P.kwargs) -> tuple[RunState, T]:
            run, opened = begin(run, name_of(run, *args, **kwargs), leftover)
            run, result, bought = work(run, opened.budget, *args, **kwargs)
            return end(run, opened, bought), result

        return run_phase

    return timed


def with_readings(run: RunState, readings: list[Reading]) -> RunState:
    """The run with more readings of the machine taken while it timed."""
    noise = dataclasses.replace(run.noise, during=[*run.noise.during, *readings])
    return dataclasses.replace(run, noise=noise)


def skip(run: RunState, method: str, why: str) -> RunState:
    say(f"[yellow]{method} skipped: {why}[/yellow]")
    skipped = {**run.evidence.skipped, method: why}
    return dataclasses.replace(run, evidence=dataclasses.replace(run.evidence, skipped=skipped))


def refuse_small_budget(run: RunState) -> None:
    # from the command's start, with what it keeps back for its ending
    least = run.budget.elapsed() + plan.least_budget(run.facts) + run.budget.reserve
    if run.budget.seconds is not None and run.budget.seconds < least:
        busy = "; the machine is busy" if run.noise.busy else ""
        raise AutotuneError(
            f"--budget {clock(run.budget.seconds)} is too small for this model here (one "
            f"forward takes {run.facts.forward_s * 1e3:.0f} ms{busy}): the least useful "
            f"run needs about {clock(least)} (m:s); give --budget {int(least // 60) + 1}m "
            "or more"
        )


def drop_untrainable(run: RunState) -> RunState:
    """Head kinds that cannot be trained here, or not in the time the plan gives them,
    are dropped (with the command that trains them), and the plan made without them."""
    dropped = plan.untrainable(run.facts, run.evidence, seconds_left(run))
    for name, kind in run.facts.train.items():
        if kind in dropped and name not in run.evidence.skipped:
            run = skip(
                run,
                name,
                f"{dropped[kind]}: train {kind} heads with `autotune heads train --kind "
                f"{kind} --model {run.ws.ref.spec}` (profile finds them in its heads cache)",
            )
    return run
