"""How a method runs one of its studies: named after the model, labelled with what it
measures, bound to the run's study database, workers and time budget."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from autotune import plan
from autotune.methods.base import TuneContext

# ASHA keeps the best third of the trials at each rung (Ray's and the paper's default):
# rungs at grace, 3 x grace, ... results.
REDUCTION_FACTOR = 3
# A study whose trials may be pruned runs until it holds ``trials`` whole ones, or this
# many times as many trials of every kind (or until its time is spent).
PRUNED_CAP = 3


def run_method_study(
    ctx: TuneContext,
    name: str,
    space: dict,
    objective: Callable[[dict], dict],
    *,
    trials: int,
    label: str,
    objective_text: str = "measured speedup",
    seeds: Sequence[dict] = (),
    sampler: Any = None,
    budget: float | None = None,
    timed: bool = True,
    attrs: dict | None = None,
):
    """Run study ``<model>/<name>`` until it holds ``trials`` finished trials or ``budget``
    seconds are spent; return the Optuna study. With less than ``plan.LEAST_STUDY_S`` seconds
    left no trial is started (starting Ray's workers alone takes some of that): the
    study is returned as it stands, and the caller falls back on what it predicted.

    A ``Progressive`` objective runs under ASHA (``asha``): trials behind the others at a
    rung are pruned; ``trials`` then counts whole trials, and the study stops at
    ``PRUNED_CAP`` times as many of every kind.

    ``sampler`` None: TPE (seeded), its start-up trials the ``seeds`` (the measured
    studies' choice: a few known-good settings first, then the model of the space)."""
    import optuna

    from autotune.studies.tune import StudySpec, open_study, run_study

    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=len(seeds))

    ws = ctx.workspace
    method = name.split("/")[0]
    spec = StudySpec(
        name=f"{ws.target.name}/{name}",
        storage_url=ws.storage,
        space=space,
        metric="objective",
        trials=trials,
        sampler=sampler,
        seeds=list(seeds),
        time_budget_s=budget,
        timed=timed,
        max_trials=PRUNED_CAP * trials if isinstance(objective, Progressive) else None,
        threads=ws.hardware["threads"],
        user_attrs={
            "model": ws.target.name,
            "fingerprint": ws.target.fingerprint,
            "method": method,
            "objective": objective_text,
            **(attrs or {}),
        },
    )
    least = plan.LEAST_STUDY_S + (first_trial_seconds(ctx, objective) if timed else 0.0)
    if budget is not None and budget < least:
        ctx.note(
            f"{label}: not run, {budget:.0f} s of the time budget was left (its first "
            f"trial needs about {least:.0f} s here)"
        )
        return open_study(spec)
    scheduler = asha(objective) if isinstance(objective, Progressive) else None
    return run_study(spec, objective, label=label, workers=ctx.workers, scheduler=scheduler)


@runtime_checkable
class TimedObjective(Protocol):
    """A measured trial: its method and plain greedy decode these prompts side by side."""

    prompts: list
    max_new_tokens: int


@runtime_checkable
class Progressive(Protocol):
    """A trial that reports as it goes, cheapest fidelity first: ``steps(config)`` yields
    ``fidelities`` results (e.g. one after each prompt, the speedup over the prompts so
    far), the last the trial's final one; a scheduler may stop it after ``grace`` or more.
    Calling it returns the final result alone."""

    fidelities: int
    grace: int

    def steps(self, config: dict) -> Iterator[dict]: ...  # may end early (tune.STOPPED)

    def __call__(self, config: dict) -> dict: ...


def asha(objective: Progressive):
    """Ray Tune's ASHA over a progressive objective's results: rungs at ``grace``,
    ``REDUCTION_FACTOR`` x ``grace``, ... results, up to a whole trial."""
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="training_iteration",  # results so far: the objective's fidelity
        metric="objective",
        mode="max",
        max_t=objective.fidelities,
        grace_period=min(objective.grace, objective.fidelities),
        reduction_factor=REDUCTION_FACTOR,
    )


def first_trial_seconds(ctx: TuneContext, objective: Any) -> float:
    """About how long one measured trial's first rung takes on this machine: both
    decoders' tokens at a forward each, over all its prompts or, for a progressive
    objective, its ``grace`` prompts (its method on them, and plain greedy timed once).
    A study whose budget cannot finish that is not started: on 2 cores a Medusa study
    once spent 37 s of a 48 s budget on a trial it could not finish."""
    if not isinstance(objective, TimedObjective):
        return 0.0
    prompts = len(objective.prompts)
    if isinstance(objective, Progressive):
        prompts = min(prompts, objective.grace)
    return 2 * prompts * objective.max_new_tokens * ctx.workspace.verify_curve(1)(1)


def completed(study) -> list:
    import optuna

    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
