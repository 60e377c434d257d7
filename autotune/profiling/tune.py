"""Training and tuning: every contender's setting, chosen on the search split. With a
leader known, its study comes first; then the answers heads also learn from, each head
kind's training, the other methods' studies, and the expansions (CAPE) fitted on the
chain methods."""

from __future__ import annotations

import dataclasses

from autotune import plan
from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.methods import registry
from autotune.methods.base import Method, TuneContext
from autotune.profile.blocks import MethodSettings
from autotune.profiling import state
from autotune.profiling.calibrate import extra_answers
from autotune.profiling.probe import context
from autotune.profiling.request import ProfileRequest
from autotune.profiling.setup import Setup
from autotune.profiling.state import RunState
from autotune.progress import say
from autotune.schedule import Phase, Schedule
from autotune.studies.workers import Workers
from autotune.workspace import Workspace


def tune(run: RunState) -> tuple[RunState, dict[str, MethodSettings]]:
    """Training and tuning, after the probes: every contender's setting."""
    # with a leader known, its study comes first: a kind the rest cannot train
    # usefully is dropped now, its time going to the leader
    run = state.drop_untrainable(run)
    tuned: dict[str, MethodSettings] = {}
    lead = run.evidence.lead
    if lead is not None and lead.method not in run.evidence.skipped:
        run, tuned[lead.method] = tune_method(run, registry.method(lead.method))
        # what the leader's study left may no longer train a kind usefully
        run = state.drop_untrainable(run)
    run = _train_heads(run)
    for method in _methods(run):
        if method.name not in run.evidence.skipped and method.name not in tuned:
            run, tuned[method.name] = tune_method(run, method)
    return _fit_expansions(run, tuned)


def _methods(run: RunState) -> list[Method]:
    return [registry.method(name) for name in run.facts.methods]


def _train_heads(run: RunState) -> RunState:
    """Each head kind still in the race trained, after the extra answers they learn from."""
    kinds = list(
        dict.fromkeys(k for name, k in run.facts.train.items() if name not in run.evidence.skipped)
    )
    extras: list = []
    if kinds and run.facts.extra_answer_prompts:
        run, extras = extra_answers(run)
    for kind in kinds:
        run, _ = train(run, kind, extras)
    return run


@state.phase(lambda run, kind, extras: f"train {kind} heads")
def train(run: RunState, budget: Budget, kind: str, extras: list) -> tuple[RunState, None, str]:
    """Heads of ``kind`` trained in their share; the methods drafting with them use them
    (or are skipped, with why, when they could not be trained)."""
    from autotune.training.job import train_kind

    names = [n for n, k in run.facts.train.items() if k == kind]
    try:
        folder = train_kind(run.ws, extras, plan.ANSWER_TOKENS, kind, budget.seconds)
    except AutotuneError as exc:  # e.g. too few answers fitted the time to train on
        for name in names:
            run = state.skip(run, name, f"its {kind} heads could not be trained: {exc}")
        return run, None, "nothing"
    trained = dataclasses.replace(run.evidence, trained=run.evidence.trained | {kind})
    run = dataclasses.replace(
        run, heads={**run.heads, **dict.fromkeys(names, folder)}, evidence=trained
    )
    return run, None, f"{kind} heads"


@state.phase(lambda run, method: f"tune {method.name}")
def tune_method(
    run: RunState, budget: Budget, method: Method
) -> tuple[RunState, MethodSettings, str]:
    """``method``'s setting, chosen on the search split in its share (or in --time-budget)."""
    if run.tuning.time_budget_s is not None:
        budget = Budget(run.tuning.time_budget_s, within=budget.within)
    say(f"{method.name}: {method.title}")
    ctx = context(run, method, budget)
    settings = method.tune(ctx)
    tuned = settings.model_copy(update={"notes": settings.notes + ctx.notes})
    return run, tuned, _bought(settings)


def _fit_expansions(
    run: RunState, tuned: dict[str, MethodSettings]
) -> tuple[RunState, dict[str, MethodSettings]]:
    chains = [m for m in _methods(run) if m.chain and m.name in tuned]
    if not chains or not run.setup.expansions:
        return run, tuned
    return _fit(run, tuned, chains)


@state.phase(lambda run, tuned, chains: f"fit {run.facts.expansion}")
def _fit(
    run: RunState, budget: Budget, tuned: dict[str, MethodSettings], chains: list[Method]
) -> tuple[RunState, dict[str, MethodSettings], str]:
    fitted = fit_expansions(run.setup, run.ws, tuned, budget, chains, dict(run.heads))
    bought = f"{run.facts.expansion} for {', '.join(m.name for m in chains)}"
    return run, fitted, bought


def _bought(settings: MethodSettings) -> str:
    """What a method's tuning bought: its measured trials, as far as it says."""
    search = settings.search or {}
    trials = search.get("measured_trials")
    if isinstance(trials, list):
        return f"{len(trials)} measured trials"
    for key in ("mask_trials", "exit_trials", "trials"):
        if isinstance(search.get(key), int):
            return f"{search[key]} {key.replace('_', ' ')}"
    return "a setting"


def fit_expansions(
    setup: Setup,
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    budget: Budget,
    chains: list[Method] | None = None,
    heads: dict | None = None,
) -> dict[str, MethodSettings]:
    """The tuned settings with each expansion (CAPE) fitted for every chain method, on
    the search split (the selection decides whether the method keeps it). ``heads``: each
    head method's folder, those trained in this run included (default: the setup's)."""
    chains = chains if chains is not None else [m for m in setup.methods if m.chain]
    heads = heads if heads is not None else setup.heads
    out = dict(tuned)
    for expansion in setup.expansions:
        for method in chains:
            ctx = TuneContext(
                ws,
                setup.spaces[expansion.name],
                budget.part(expansion.fit_share),
                Workers(),
                heads.get(method.name),
                base_space=setup.spaces[method.name],
            )
            out[method.name] = expansion.fitted(method, out[method.name], ctx)
    return out


# --- for scripts that tune without a whole profile's plan --------------------------------


def tuning_schedule(setup: Setup, seconds: float = plan.NO_BUDGET_S) -> Schedule:
    """The searches alone, ``seconds`` each (the methods' and fitting the expansions)."""
    names = [f"tune {m.name}" for m in setup.methods]
    names += [f"fit {e.label}" for e in registry.expansions().values()]
    return Schedule(Budget(None), [Phase(name, seconds) for name in names])


def tune_methods(
    setup: Setup, ws: Workspace, request: ProfileRequest, schedule: Schedule
) -> dict[str, MethodSettings]:
    """Each method's setting, chosen on the search split within ``schedule``'s phases."""
    tuned = {}
    for method in setup.methods:
        share = schedule.begin(f"tune {method.name}")
        ctx = TuneContext(
            ws,
            setup.spaces[method.name],
            share if request.time_budget_s is None else Budget(request.time_budget_s),
            request.workers,
            setup.heads.get(method.name),
            request.trials,
            engines=request.engines,
        )
        settings = method.tune(ctx)
        tuned[method.name] = settings.model_copy(update={"notes": settings.notes + ctx.notes})
    return tuned
