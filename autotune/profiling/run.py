"""`autotune profile` from end to end: the phases in order, each a function from the run's
state to a new one (``autotune.profiling`` says what each does)."""

from __future__ import annotations

from pathlib import Path

from autotune.budget import Budget
from autotune.profile.blocks import MethodSettings
from autotune.profile.io import check_writable, write_profile
from autotune.profile.report import plot_path, write_verdict_plot
from autotune.profile.schema import ProfileBase
from autotune.profiling import state
from autotune.profiling.calibrate import check_machine, open_workspace, start
from autotune.profiling.heldback import (
    HeldBack,
    engine_settings_to_measure,
    measure_engine_settings,
    measure_held_back,
)
from autotune.profiling.load import load_summary, measure_load
from autotune.profiling.report import assemble
from autotune.profiling.request import ProfileRequest, default_out
from autotune.profiling.select import Selection, select
from autotune.profiling.setup import make_setup
from autotune.profiling.state import RunState
from autotune.profiling.tune import tune
from autotune.profiling.verdict import decide


def run_profile(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    budget = Budget(request.budget_s)
    setup = make_setup(request)
    ws = open_workspace(request)
    ws.deadline = budget
    out = request.out or default_out(ws.target.name)
    check_writable(out)
    noise = check_machine(ws, threads_chosen=request.threads is not None)
    run, tuned = tune(start(setup, ws, request, budget, noise))
    run, selection = selected(run, tuned)
    run, held = held_back(run, selection)
    verdict = decide(
        selection.tuned, selection.ranking, held, request.margin, run.evidence.skipped
    ).model_copy(update={"dropped": selection.dropped})
    run, tuned, held = after_verdict(run, selection.tuned, verdict.recommended, held)
    verdict = verdict.model_copy(update={"time": list(run.ledger)})
    profile = assemble(ws, tuned, held, verdict, run.noise, request)
    write_profile(profile, out)
    write_verdict_plot(profile, plot_path(out))
    return profile, out


def selected(run: RunState, tuned: dict[str, MethodSettings]) -> tuple[RunState, Selection]:
    """The race on search prompts, in its share of the time."""
    run, phase = state.begin(run, "selection (search prompts)")
    selection = select(run.ws, tuned, run.request, phase.budget)
    left = len(selection.ranking) - len(selection.dropped)
    bought = (
        f"{left} of {len(selection.ranking)} methods left in the race "
        f"({selection.stopped or 'no race'})"
    )
    return state.end(run, phase, bought), selection


def held_back(run: RunState, selection: Selection) -> tuple[RunState, HeldBack]:
    """The finalists measured once on held-back prompts: the figures reported."""
    run, phase = state.begin(run, "held-back measurement")
    held = measure_held_back(run.ws, selection, run.request, phase.budget)
    run = state.with_readings(run, held.readings)
    prompts = max((len(m.prompts) for m in held.measured.values()), default=0)
    bought = f"{', '.join(held.measured) or 'nothing'} on {prompts} prompts"
    return state.end(run, phase, bought), held


def after_verdict(
    run: RunState, tuned: dict[str, MethodSettings], recommended: str, held: HeldBack
) -> tuple[RunState, dict[str, MethodSettings], HeldBack]:
    """In the time left: the recommended method as each engine serves it (in the time
    the run has left, unplanned, less what the load levels are planned), then under load
    (planned; it takes what the run has left)."""
    request = run.request
    load_kept = state.planned(run, "under load (held back)") if request.concurrency else 0.0
    if engine_settings_to_measure(tuned, recommended):
        run, phase = state.begin(run, "engine settings (held back)")
        held = measure_engine_settings(run.ws, tuned, recommended, held, request, load_kept)
        run = state.end(run, phase, f"{recommended} as each engine serves it")
    if request.concurrency and recommended in tuned:
        run, phase = state.begin(run, "under load (held back)")
        tuned = measure_load(run.ws, tuned, recommended, held, request)
        run = state.end(run, phase, load_summary(tuned[recommended].load))
    return run, tuned, held
