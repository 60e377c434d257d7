"""What a study run through Ray Tune shows as it goes, and keeps of Tune's trials: a rich
progress bar at the study's counted trials with the best objective so far, and each
trial's Tune record (its error file says why a worker died)."""

from __future__ import annotations

import contextlib
import math
import os

from ray.tune import Callback
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from autotune.studies.trainable import FINAL
from autotune.studies.trials import budgeted

_RUNS: dict[str, dict] = {}  # Tune pickles its callbacks: they hold a key, not the bar


class RunCallback(Callback):
    """Keeps Tune's trials at hand (their error files say why a worker died) and
    advances a rich progress bar as Ray Tune finishes trials."""

    def __init__(self, key: str):
        self.key = key

    def on_trial_start(self, iteration, trials, trial, **info):
        if self.key in _RUNS:
            _RUNS[self.key]["trials"][trial.trial_id] = trial

    def _advance(self, trial) -> None:
        if self.key not in _RUNS:
            return
        run = _RUNS[self.key]
        last = trial.last_result or {}
        value = last.get("objective") if last.get(FINAL, True) else None  # pruned: partial
        if value is not None and math.isfinite(value) and value > run["best"]:
            run["best"] = value
            run["bar"].update(run["task"], best=f"{value:.3f}")
        _count(run)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._advance(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._advance(trial)


def _count(run: dict) -> None:
    """The bar at the study's counted trials since the run began (a trial queued again
    counts once, through its re-run; another process's trials on the study count too:
    the budget is the study's)."""
    with contextlib.suppress(Exception):  # a database hiccup costs a bar update, no more
        done = budgeted(run["study"].get_trials(deepcopy=False)) - run["before"]
        run["bar"].update(run["task"], completed=max(0, min(done, run["total"])))


class RunProgress:
    """While a run lasts: its bar, and what its callback keeps (``_RUNS[key]``)."""

    def __init__(self, label: str, key: str, total: int, study):
        self.label, self.key, self.total, self.study = label, key, total, study

    def __enter__(self) -> RunCallback:
        from autotune.progress import console

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        task = bar.add_task(self.label, total=self.total, best="-")
        before = budgeted(self.study.get_trials(deepcopy=False))
        _RUNS[self.key] = {
            "bar": bar,
            "task": task,
            "best": -math.inf,
            "trials": {},
            "study": self.study,
            "before": before,
            "total": self.total,
        }
        bar.start()
        return RunCallback(self.key)

    def __exit__(self, *exc):
        run = _RUNS.pop(self.key)
        _count(run)
        run["bar"].stop()
        return False


def worker_error(key: str, trial_id: str) -> str:
    """Why Ray lost a trial, from the error Tune wrote for it."""
    trial = _RUNS.get(key, {}).get("trials", {}).get(trial_id)
    text = ""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path, errors="replace") as stream:
            text = stream.read()
    # e.g. "ray.exceptions.ActorDiedError: The actor died unexpectedly ...", then
    # "The actor is dead because its worker process has died. Worker exit type: ..."
    errors = [line.strip() for line in text.splitlines() if line.startswith("ray.exceptions.")]
    causes = [line.strip().split(". ")[0] for line in text.splitlines() if " because " in line]
    detail = "; ".join(dict.fromkeys(errors[-1:] + causes[-1:]))
    # Ray's memory monitor killed it (not merely Ray's list of "common causes")
    memory = "out of memory: " if "OutOfMemoryError" in text else ""
    return (f"{memory}the Ray worker running it died" + (f" ({detail})" if detail else ""))[:400]
