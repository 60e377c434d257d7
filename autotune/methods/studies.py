"""How a method runs one of its studies: named after the model, labelled with what it
measures, bound to the run's study database, workers and time budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from autotune.methods.base import TuneContext

# Seconds a study needs at the least: Ray's workers start and load the model, and a
# measured trial decodes a few prompts.
MIN_STUDY_S = 20.0


def run_method_study(
    ctx: TuneContext,
    name: str,
    space: dict,
    objective: Callable[[dict], dict],
    *,
    trials: int,
    label: str,
    objective_text: str,
    seeds: Sequence[dict] = (),
    sampler: Any = None,
    budget: float | None = None,
    timed: bool = True,
    attrs: dict | None = None,
):
    """Run study ``<model>/<name>`` until it holds ``trials`` finished trials or ``budget``
    seconds are spent; return the Optuna study. With less than ``MIN_STUDY_S`` seconds
    left no trial is started (starting Ray's workers alone takes some of that): the
    study is returned as it stands, and the caller falls back on what it predicted."""
    from autotune.studies.tune import StudySpec, open_study, run_study

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
        threads=ws.hardware["threads"],
        user_attrs={
            "model": ws.target.name,
            "fingerprint": ws.target.fingerprint,
            "method": method,
            "objective": objective_text,
            **(attrs or {}),
        },
    )
    least = MIN_STUDY_S + (first_trial_seconds(ctx, objective) if timed else 0.0)
    if budget is not None and budget < least:
        ctx.note(
            f"{label}: not run, {budget:.0f} s of the time budget was left (its first "
            f"trial needs about {least:.0f} s here)"
        )
        return open_study(spec)
    return run_study(spec, objective, label=label, workers=ctx.workers)


@runtime_checkable
class TimedObjective(Protocol):
    """A measured trial: its method and plain greedy decode these prompts side by side."""

    prompts: list
    max_new_tokens: int


def first_trial_seconds(ctx: TuneContext, objective: Any) -> float:
    """About how long one measured trial takes on this machine: both decoders' tokens at
    a forward each (a study whose budget cannot finish one is not started: on 2 cores a
    Medusa study once spent 37 s of a 48 s budget on a trial it could not finish)."""
    if not isinstance(objective, TimedObjective):
        return 0.0
    tokens = len(objective.prompts) * objective.max_new_tokens
    return 2 * tokens * ctx.workspace.verify_curve(1)(1)


def completed(study) -> list:
    import optuna

    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
