"""Run an Optuna study through Ray Tune: Ray runs the trials, Optuna (bound to the study
database) suggests them. Thin adapter; the objectives live in ``autotune.tuners``.
Imports Ray: import this module only where a study runs."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from ray.tune import Callback
from ray.tune.search.optuna import OptunaSearch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class StudySpec:
    name: str                       # always explicit: OptunaSearch's default is "optuna"
    storage_url: str
    space: dict[str, Any]           # parameter name -> optuna distribution
    metric: str
    trials: int                     # total wanted, counting trials finished in earlier runs
    sampler: Any = None
    seeds: list[dict] = field(default_factory=list)
    time_budget_s: float | None = None
    cpus_per_trial: float = 1.0
    user_attrs: dict[str, Any] = field(default_factory=dict)


optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def init_ray(address: str | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=True, logging_level="ERROR")


def fail_stale_trials(study) -> int:
    """Trials left RUNNING by a process that died: Optuna's heartbeat does not cover the
    ask/tell interface Ray drives, so we close them ourselves before resuming."""

    stale = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.RUNNING]
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, "fail_reason",
                                             "left running by an interrupted run")
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    return len(stale)


def run_study(spec: StudySpec, objective: Callable[[dict], dict], *, label: str,
              ray_address: str | None = None, workers: int = 1):
    """Run until ``spec.trials`` trials have finished in the study (or the time budget
    is spent); return the Optuna study."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    from autotune.studies.storage import open_storage

    storage = open_storage(spec.storage_url)
    study = optuna.create_study(study_name=spec.name, storage=storage, direction="maximize",
                                load_if_exists=True)
    for key, value in spec.user_attrs.items():
        study.set_user_attr(key, value)
    fail_stale_trials(study)
    finished = [t for t in study.get_trials() if t.state.is_finished()]
    remaining = spec.trials - len(finished)
    if remaining <= 0:
        return study
    done_params = [t.params for t in finished]
    seeds = [s for s in spec.seeds if s not in done_params]
    searcher = RecordingOptunaSearch(space=spec.space, metric=spec.metric, mode="max",
                            sampler=spec.sampler, study_name=spec.name, storage=storage,
                            points_to_evaluate=seeds or None)
    searcher = ConcurrencyLimiter(searcher, max_concurrent=max(1, workers))
    init_ray(ray_address)
    with _progress(label, total=remaining) as callback:
        tuner = tune.Tuner(
            tune.with_resources(_reporting(objective), {"cpu": spec.cpus_per_trial}),
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=remaining,
                                        time_budget_s=spec.time_budget_s, reuse_actors=True),
            run_config=tune.RunConfig(name=_run_name(spec.name), verbose=0,
                                      storage_path=_ray_results_dir(), callbacks=[callback],
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
        # Ray prints its experiment summary on stdout; keep stdout for our results (--json).
        with contextlib.redirect_stdout(sys.stderr):
            tuner.fit()
    return optuna.load_study(study_name=spec.name, storage=storage)


ATTR_PREFIX = "attr_"


def _reporting(objective: Callable[[dict], dict]):
    """Wrap an objective so that every outcome reaches the searcher as a result: a
    crash inside the objective becomes a NaN objective with its reason attached."""

    def trainable(config: dict) -> None:
        from ray import tune

        try:
            result = objective(config)
        except Exception as exc:  # recorded as a failed trial; the study goes on
            result = {"objective": math.nan,
                      "fail_reason": f"{type(exc).__name__}: {exc}"[:500]}
        tune.report({"objective": result.get("objective", math.nan),
                     **{ATTR_PREFIX + k: v for k, v in result.items()}})
    trainable.__name__ = getattr(objective, "__name__", type(objective).__name__)
    return trainable


class RecordingOptunaSearch(OptunaSearch):
    """OptunaSearch that keeps each trial's reported figures as user attributes and
    records a NaN or failed trial as FAIL with its reason (OptunaSearch would swallow
    Optuna's refusal of NaN and leave the trial RUNNING)."""

    def on_trial_complete(self, trial_id, result=None, error=False):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return super().on_trial_complete(trial_id, result, error)
        for key, value in (result or {}).items():
            if key.startswith(ATTR_PREFIX) and isinstance(value, (bool, int, float, str, list, dict)):
                ot_trial.set_user_attr(key[len(ATTR_PREFIX):], value)
        value = (result or {}).get("objective")
        if value is None or not math.isfinite(value):
            if error:
                ot_trial.set_user_attr("fail_reason", "the worker running the trial died")
            elif "fail_reason" not in ot_trial.user_attrs:
                ot_trial.set_user_attr("fail_reason", f"objective was {value}")
            self._ot_study.tell(ot_trial, None, state=optuna.trial.TrialState.FAIL)
            self._completed_trials.add(trial_id)
            return None
        return super().on_trial_complete(trial_id, result, error)


def _run_name(study_name: str) -> str:
    return study_name.replace("/", "__").replace(":", "_")


def _ray_results_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), "autotune-ray")
    os.makedirs(path, exist_ok=True)
    return path


_BARS: dict[str, tuple] = {}  # Tune pickles its callbacks: they hold a key, not the bar


class _ProgressCallback(Callback):
    """Advances a rich progress bar as Ray Tune finishes trials."""

    def __init__(self, key: str):
        self.key = key

    def _advance(self, trial) -> None:
        if self.key not in _BARS:
            return
        bar, task, best = _BARS[self.key]
        value = (trial.last_result or {}).get("objective")
        if value is not None and math.isfinite(value) and value > best[0]:
            best[0] = value
            bar.update(task, best=f"{value:.3f}")
        bar.advance(task)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._advance(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._advance(trial)


class _progress:
    def __init__(self, label: str, total: int):
        self.label, self.total = label, total

    def __enter__(self) -> _ProgressCallback:
        from autotune.progress import console

        bar = Progress(TextColumn("{task.description}"), BarColumn(),
                       TextColumn("{task.completed}/{task.total}"),
                       TextColumn("best {task.fields[best]}"), TimeElapsedColumn(),
                       TextColumn("eta"), TimeRemainingColumn(), console=console)
        task = bar.add_task(self.label, total=self.total, best="-")
        _BARS[self.label] = (bar, task, [-math.inf])
        bar.start()
        return _ProgressCallback(self.label)

    def __exit__(self, *exc):
        bar, _, _ = _BARS.pop(self.label)
        bar.stop()
        return False
