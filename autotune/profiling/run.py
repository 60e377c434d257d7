"""`autotune profile` from end to end: the phases in order, each a function from the run's
state to a new one (``autotune.profiling`` says what each does)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from autotune import plan
from autotune.budget import Budget
from autotune.profile.blocks import MethodSettings
from autotune.profile.io import check_writable, write_profile
from autotune.profile.report import plot_path, write_verdict_plot
from autotune.profile.schema import ProfileBase
from autotune.profiling import in_engine, state
from autotune.profiling.calibrate import calibrate, check_machine, open_workspace, start
from autotune.profiling.heldback import (
    HeldBack,
    engine_settings_to_measure,
    measure_engine_settings,
    measure_held_back,
)
from autotune.profiling.load import load_summary, measure_load
from autotune.profiling.probe import probe_all
from autotune.profiling.report import assemble
from autotune.profiling.request import Measuring, ProfileRequest, Tuning, default_out
from autotune.profiling.select import Selection, select
from autotune.profiling.setup import make_setup
from autotune.profiling.state import RunState
from autotune.profiling.tune import tune
from autotune.profiling.verdict import decide


def run_profile(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    budget = Budget(request.budget_s, request.started, reserve=plan.CLOSING_S)
    setup = make_setup(request)
    ws = open_workspace(request)
    ws.deadline = budget
    out = request.out or default_out(ws.target.name)
    check_writable(out)
    noise = check_machine(ws, threads_chosen=request.threads is not None)
    measuring = Measuring.of(request)
    run = start(setup, ws, Tuning.of(request), measuring, budget, noise, in_engine.planned)
    run, tuned = tune(probe_all(calibrate(run)))
    run, selection = selected(run, tuned, measuring)
    run, held = held_back(run, selection, measuring)
    verdict = decide(
        selection.tuned, selection.ranking, held, measuring.margin, run.evidence.skipped
    ).model_copy(update={"dropped": selection.dropped})
    # what the profile says of llama.cpp is measured in llama-server, where it runs here
    run, tuned, in_server = in_engine.in_llama_server(run, selection.tuned, measuring)
    if in_server is not None:
        verdict = verdict.model_copy(update={"engines": {in_engine.ENGINE: in_server}})
    outcome = Outcome(tuned, verdict.recommended, held)
    run, outcome = after_verdict(run, outcome, measuring)
    verdict = verdict.model_copy(update={"time": list(run.ledger)})
    profile = assemble(ws, outcome.tuned, outcome.held, verdict, run.noise, measuring)
    write_profile(profile, out)
    write_verdict_plot(profile, plot_path(out))
    return profile, out


@state.phase(lambda run, tuned, measuring: "selection (search prompts)")
def selected(
    run: RunState, budget: Budget, tuned: dict[str, MethodSettings], measuring: Measuring
) -> tuple[RunState, Selection, str]:
    """The race on search prompts, in its share of the time."""
    selection = select(run.ws, tuned, measuring, budget)
    left = len(selection.ranking) - len(selection.dropped)
    bought = (
        f"{left} of {len(selection.ranking)} methods left in the race "
        f"({selection.stopped or 'no race'})"
    )
    return run, selection, bought


@state.phase(lambda run, selection, measuring: "held-back measurement")
def held_back(
    run: RunState, budget: Budget, selection: Selection, measuring: Measuring
) -> tuple[RunState, HeldBack, str]:
    """The finalists measured once on held-back prompts: the figures reported."""
    held = measure_held_back(run.ws, selection, measuring, budget)
    prompts = max((len(m.prompts) for m in held.measured.values()), default=0)
    bought = f"{', '.join(held.measured) or 'nothing'} on {prompts} prompts"
    return state.with_readings(run, held.readings), held, bought


@dataclass(frozen=True)
class Outcome:
    """What the verdict stands on and what follows it adds to: the tuned settings, the
    recommended method and the held-back figures."""

    tuned: dict[str, MethodSettings]
    recommended: str
    held: HeldBack


def after_verdict(
    run: RunState, outcome: Outcome, measuring: Measuring
) -> tuple[RunState, Outcome]:
    """In the time left: the recommended method as each engine serves it (in the time
    the run has left, unplanned, less what the load levels are planned), then under load
    (planned; it takes what the run has left)."""
    levels = measuring.concurrency
    load_kept = state.planned(run, "under load (held back)") if levels else 0.0
    if engine_settings_to_measure(outcome.tuned, outcome.recommended):
        run, outcome = engine_settings(run, outcome, measuring, load_kept)
    if levels and outcome.recommended in outcome.tuned:
        run, outcome = under_load(run, outcome, measuring)
    return run, outcome


@state.phase(lambda run, *args: "engine settings (held back)", leftover=True)
def engine_settings(
    run: RunState, budget: Budget, outcome: Outcome, measuring: Measuring, load_kept: float
) -> tuple[RunState, Outcome, str]:
    """Its own time is what the run has left, unplanned (less ``load_kept``)."""
    tuned, name = outcome.tuned, outcome.recommended
    held = measure_engine_settings(run.ws, tuned, name, outcome.held, measuring, load_kept)
    return run, dataclasses.replace(outcome, held=held), f"{name} as each engine serves it"


@state.phase(lambda run, *args: "under load (held back)")
def under_load(
    run: RunState, budget: Budget, outcome: Outcome, measuring: Measuring
) -> tuple[RunState, Outcome, str]:
    """Planned; it takes what the run has left."""
    name = outcome.recommended
    tuned = measure_load(run.ws, outcome.tuned, name, outcome.held, measuring)
    return run, dataclasses.replace(outcome, tuned=tuned), load_summary(tuned[name].load)
