"""Who holds a RUNNING trial, and what happens to trials nobody holds any more.

Ray's OptunaSearch drives Optuna through ask/tell, which Optuna's own heartbeat does not
cover: a trial whose process died stays RUNNING for ever. So each trial records its
owner (the process that asked for it: host, pid, start time) and that process writes a
heartbeat while it holds the trial. A RUNNING trial is stale when its owner is known to
be gone (same host, no such process) or its heartbeat is older than ``STALE_AFTER_S``
(another host). A stale trial is failed with its reason and its parameters are queued
once more, so an interrupted trial is re-run rather than lost; it does not count against
the study's trial budget. Imports Optuna, not Ray.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

HEARTBEAT_S = 10.0  # how often a process marks the trials it holds as alive
STALE_AFTER_S = 120.0  # a trial of another host with no heartbeat for this long is stale

OWNER = "owner"  # user attributes this module writes
HEARTBEAT = "heartbeat"
FAIL_REASON = "fail_reason"
REQUEUED = "requeued"  # failed through no fault of its own; queued again; not counted
RETRY_OF = "retry_of"  # the number of the trial this one re-runs


def this_process() -> dict:
    """Host, process id namespace (containers on one host see different pids), process
    id and start time (a pid can be reused)."""
    return {
        "host": socket.gethostname(),
        "pidns": _pid_namespace(),
        "pid": os.getpid(),
        "started": _start_time(os.getpid()),
    }


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _start_time(pid) -> float | None:
    import psutil

    try:
        return round(psutil.Process(int(pid)).create_time(), 2)
    except (psutil.Error, OSError, ValueError, TypeError):
        return None


def claim(trial: optuna.Trial) -> None:
    """Mark a trial just asked for as held by this process."""
    trial.set_user_attr(OWNER, this_process())
    trial.set_user_attr(HEARTBEAT, time.time())


def beat(storage, trial_ids) -> None:
    """Heartbeat for the trials this process holds (those finished meanwhile are skipped)."""
    now = time.time()
    for trial_id in trial_ids:
        with contextlib.suppress(UpdateFinishedTrialError):
            storage.set_trial_user_attr(trial_id, HEARTBEAT, now)


def stale_reason(trial: FrozenTrial, now: float | None = None) -> str | None:
    """Why nobody holds this RUNNING trial any more; None while somebody may."""
    owner = trial.user_attrs.get(OWNER)
    if not owner:
        return "left running by an interrupted run (no owner recorded)"
    me = this_process()
    if (owner.get("host"), owner.get("pidns")) == (me["host"], me["pidns"]):
        if owner.get("pid") == me["pid"] and owner.get("started") == me["started"]:
            return None
        started = _start_time(owner.get("pid"))
        if started is None or started != owner.get("started"):
            return (
                f"left running by an interrupted run (process {owner.get('pid')} on "
                f"{owner.get('host')} is gone)"
            )
        return None
    last = trial.user_attrs.get(HEARTBEAT)
    if last is None and trial.datetime_start is not None:
        last = trial.datetime_start.timestamp()
    age = (now or time.time()) - (last or 0.0)
    if age > STALE_AFTER_S:
        return (
            f"left running by an interrupted run (no heartbeat from {owner.get('host')} "
            f"for {age:.0f} s)"
        )
    return None


def fail_stale_trials(study) -> int:
    """Fail the RUNNING trials nobody holds, each with its reason, and queue each once
    more; return how many were failed here (another process may have done some)."""
    failed = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = stale_reason(trial)
        if reason is not None and fail_and_requeue(study, trial, reason):
            failed += 1
    return failed


def fail_and_requeue(study, trial: FrozenTrial, reason: str) -> bool:
    """Fail a trial that did not fail through its own parameters, and queue its parameters
    again (once: a re-run that fails too stays failed, and counts). False when it was
    already finished (another process got there first)."""
    storage, trial_id = study._storage, trial._trial_id
    retry = RETRY_OF not in trial.user_attrs and bool(trial.params)
    try:
        storage.set_trial_user_attr(trial_id, FAIL_REASON, reason)
        if retry:
            storage.set_trial_user_attr(trial_id, REQUEUED, True)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    if retry:
        study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number})
    return True


def counted(trials: list[FrozenTrial]) -> int:
    """Trials that count against a study's budget: finished, and not queued again."""
    return sum(t.state.is_finished() and not t.user_attrs.get(REQUEUED) for t in trials)
