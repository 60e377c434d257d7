"""The search algorithm of a study run through Ray Tune: OptunaSearch bound to the study
database, that keeps to the study's trial budget and records every outcome in it."""

from __future__ import annotations

import contextlib
import math
import time
import warnings

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from autotune.studies import trials as held
from autotune.studies.run_progress import worker_error
from autotune.studies.trainable import ATTR_PREFIX, FIDELITY, FINAL
from autotune.studies.trials import budgeted


class RecordingOptunaSearch(OptunaSearch):
    """OptunaSearch that
    - stops asking once the study (in the database, all processes together) has
      ``budget`` counted trials (``budgeted``: pruned ones not) or ``cap`` counted trials
      of every kind, or the trials running could reach either (waiting for its own,
      which may yet fail, be pruned or be queued again);
    - marks each trial it asks for as held by this process (``trials.claim``);
    - keeps each trial's reported figures as user attributes;
    - records a NaN or failed trial as FAIL with its reason (OptunaSearch would swallow
      Optuna's refusal of NaN and leave the trial RUNNING);
    - records a trial that a scheduler stopped after a result that was not its final one
      as PRUNED, its intermediate values reported (OptunaSearch would record it COMPLETE
      with its partial figure);
    - fails a trial whose worker died, or that Tune stopped before it reported, and
      queues its parameters again;
    - writes no checkpoint: the study database is the checkpoint (and a pickled storage
      is how a password would reach the disk)."""

    def __init__(self, *args, budget: int, cap: int | None = None, key: str = "", **kwargs):
        if not kwargs.get("study_name"):  # OptunaSearch would call every study "optuna"
            raise ValueError("RecordingOptunaSearch needs an explicit study_name")
        super().__init__(*args, **kwargs)
        self._budget = budget
        self._cap = max(budget, cap or 0)
        self._key = key
        self._checked = -math.inf  # monotonic time of the last "wait" verdict

    def suggest(self, trial_id):
        if trial_id not in self._ot_trials:
            verdict = self._budget_verdict()
            if verdict is not True:
                return verdict
        params = super().suggest(trial_id)
        held.claim(self._ot_trials[trial_id])
        return params

    def _budget_verdict(self):
        """True: ask for a trial; FINISHED: the budget is spent; None: not now."""
        if time.monotonic() - self._checked < 1.0:
            time.sleep(0.1)  # Tune asks again at once: don't spin while waiting
            return None
        trials = self._study().get_trials(deepcopy=False)
        counted, done = held.counted(trials), budgeted(trials)
        if done >= self._budget or counted >= self._cap:
            return Searcher.FINISHED
        running = [t._trial_id for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if done + len(running) >= self._budget or counted + len(running) >= self._cap:
            if not set(running) & set(self.held_trial_ids()):
                # the rest is in other processes' hands; waiting here would keep this
                # run's idle workers, and so the cores their trials wait for
                return Searcher.FINISHED
            self._checked = time.monotonic()  # ours may yet fail and be queued again
            return None
        return True

    def _study(self) -> optuna.Study:
        if self._ot_study is None:
            raise RuntimeError("the searcher has no study yet: Tune sets it up before asking")
        return self._ot_study

    def held_trial_ids(self) -> list[int]:
        return [
            t._trial_id
            for tid, t in list(self._ot_trials.items())
            if tid not in self._completed_trials
        ]

    def on_trial_complete(self, trial_id, result=None, error=False):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return None
        self._completed_trials.add(trial_id)
        self._checked = -math.inf
        # failed meanwhile as stale by another process: nothing to record
        with contextlib.suppress(UpdateFinishedTrialError):
            self._record(trial_id, ot_trial, result, error)
        return None

    def _record(self, trial_id, ot_trial, result, error) -> None:
        result = result or {}
        value = result.get("objective")
        if error or value is None:
            reason = (
                worker_error(self._key, trial_id)
                if error
                else "stopped before it reported (time budget spent, or the run was interrupted)"
            )
            self._release(ot_trial, reason)
            return
        for key, attr in result.items():
            if key.startswith(ATTR_PREFIX) and isinstance(
                attr, (bool, int, float, str, list, dict)
            ):
                ot_trial.set_user_attr(key[len(ATTR_PREFIX) :], attr)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            if not result.get(ATTR_PREFIX + "fail_reason"):
                ot_trial.set_user_attr("fail_reason", f"objective was {value!r}")
            self._study().tell(ot_trial, None, state=optuna.trial.TrialState.FAIL)
            return
        # Tune passes a result at which a scheduler stops the trial to on_trial_complete
        # alone: Optuna hears of it here (a step already reported is ignored)
        step = result.get("training_iteration") or result.get(FIDELITY) or 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ot_trial.report(float(value), int(step))
        if result.get(FINAL) is False:  # a scheduler stopped it: Optuna's word is pruned
            self._study().tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
            return
        self._study().tell(ot_trial, float(value))

    def _release(self, ot_trial, reason: str) -> None:
        study = self._study()
        frozen = study._storage.get_trial(ot_trial._trial_id)
        held.fail_and_requeue(study, frozen, reason)

    def release_unfinished(self, reason: str) -> None:
        """Trials this run asked for and never heard of again (Tune ends a run without
        telling the searcher about the trials it stops)."""
        if self._ot_study is None:
            return
        for tid, ot_trial in list(self._ot_trials.items()):
            if tid in self._completed_trials:
                continue
            self._completed_trials.add(tid)
            with contextlib.suppress(UpdateFinishedTrialError):
                self._release(ot_trial, reason)

    def save(self, checkpoint_path: str):
        raise NotImplementedError("the study database is the checkpoint")
