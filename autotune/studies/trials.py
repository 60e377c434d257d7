"""Who holds a RUNNING trial, and what happens to trials nobody holds any more.

Liveness is the storage's own heartbeat (Optuna's RDB heartbeat: one row per trial,
stamped with the database's clock, so no two machines' clocks are ever compared). Ray's
OptunaSearch drives Optuna through ask/tell, which Optuna's heartbeat thread (that of
``study.optimize``) does not cover, so a process beats for the trials it holds itself
(``beat``), and our storage beats for a trial the moment it takes it up
(``autotune.studies.rdb``).

A RUNNING trial is stale when
- its owner provably is gone: a process of this very kernel boot and PID namespace that
  no longer runs (the boot id is random per boot, so no other machine can match it, and
  a rerun after Ctrl-C or a kill need not wait); or else, when the owner is not of this
  machine,
- its heartbeat is older than the storage's grace period (``GRACE_S``).
A RUNNING trial that never beat (left by an older autotune, or another tool) is given a
heartbeat on first sight: it turns stale after the grace period unless someone beats it.
A stale trial is failed with its reason and its parameters are queued once more, so an
interrupted trial is re-run rather than lost; it does not count against the study's
trial budget. Storages without a heartbeat get the owner rule alone. Imports Optuna,
not Ray.
"""

from __future__ import annotations

import contextlib
import os
import socket

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

# Optuna takes whole seconds. A process beats every HEARTBEAT_S; GRACE_S allows for many
# missed beats (a busy database, a paused machine) before a trial of another machine is
# taken for abandoned: that delay is the price of never failing a live trial.
HEARTBEAT_S = 10
GRACE_S = 120

OWNER = "owner"  # user attributes this module writes
FAIL_REASON = "fail_reason"
REQUEUED = "requeued"  # failed through no fault of its own; queued again; not counted
RETRY_OF = "retry_of"  # the number of the trial this one re-runs


def this_process() -> dict:
    """Host (for people), kernel boot and PID namespace (which processes this one can
    see), process id and start time (a pid can be reused)."""
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pidns": _pid_namespace(),
        "pid": os.getpid(),
        "started": _start_time(os.getpid()),
    }


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as stream:
            return stream.read().strip() or None
    except OSError:
        return None  # not Linux: other machines' trials are told apart by heartbeat alone


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


def owner_alive(owner) -> bool | None:
    """Whether the process that holds a trial still runs: True or False when it is of
    this machine (same boot, same PID namespace), None when that cannot be told here."""
    if not isinstance(owner, dict):
        return None
    me = this_process()
    if me["boot"] is None or me["pidns"] is None:
        return None
    if (owner.get("boot"), owner.get("pidns")) != (me["boot"], me["pidns"]):
        return None
    if owner.get("pid") == me["pid"] and owner.get("started") == me["started"]:
        return True
    started = _start_time(owner.get("pid"))
    return started is not None and started == owner.get("started")


def heartbeat_enabled(storage) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(storage)


def grace_s(storage) -> int | None:
    """The storage's grace period, when it has a heartbeat."""
    if not heartbeat_enabled(storage):
        return None
    backend = getattr(storage, "_backend", storage)  # studies wrap it in a cache
    interval = storage.get_heartbeat_interval()
    return getattr(backend, "grace_period", None) or 2 * interval


def claim(trial: optuna.Trial) -> None:
    """Mark a trial just asked for as held by this process."""
    trial.set_user_attr(OWNER, this_process())
    beat(trial.study._storage, [trial._trial_id])


def beat(storage, trial_ids) -> None:
    """Heartbeat for the trials this process holds (the database's clock stamps it)."""
    if not heartbeat_enabled(storage):
        return
    for trial_id in trial_ids:
        storage.record_heartbeat(trial_id)


def stale_reason(trial: FrozenTrial, late: bool = False, grace: int | None = None) -> str | None:
    """Why nobody holds this RUNNING trial any more; None while somebody may.
    ``late``: its heartbeat is older than the storage's grace period."""
    owner = trial.user_attrs.get(OWNER)
    alive = owner_alive(owner)
    if alive is False and isinstance(owner, dict):
        return (
            f"left running by an interrupted run (process {owner.get('pid')} on "
            f"{owner.get('host')} is gone)"
        )
    if alive or not late:
        return None
    host = owner.get("host") if isinstance(owner, dict) else None
    return (
        f"left running by an interrupted run (no heartbeat from {host or 'its process'} "
        f"for over {grace or GRACE_S} s)"
    )


def fail_stale_trials(study) -> int:
    """Fail the RUNNING trials nobody holds, each with its reason, and queue each once
    more; return how many were failed here (another process may have done some)."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return 0
    storage = study._storage
    late: set[int] = set()
    if heartbeat_enabled(storage):
        backend = getattr(storage, "_backend", storage)
        adopt = getattr(backend, "adopt_unbeaten", None)
        if adopt is not None:
            adopt([t._trial_id for t in running])
        # Optuna's own rule: a heartbeat older than the grace period, by the database's clock
        late = set(storage._get_stale_trial_ids(study._study_id))
    grace = grace_s(storage)
    failed = 0
    for trial in running:
        reason = stale_reason(trial, trial._trial_id in late, grace)
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
        if not storage.set_trial_state_values(trial_id, TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    if retry:
        study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number})
    return True


def requeue_stale(study, trial: FrozenTrial) -> None:
    """Optuna's failed-trial callback (its own stale scan, in ``study.optimize``, has
    already failed the trial): queue its parameters once more, as ``fail_and_requeue``
    does."""
    if RETRY_OF in trial.user_attrs or not trial.params:
        return
    with contextlib.suppress(UpdateFinishedTrialError):
        study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number})


def counted(trials) -> int:
    """Trials that count against a study's budget: finished, and not queued again (a
    failed trial that another re-runs is counted through its re-run)."""
    trials = list(trials)
    rerun = {t.user_attrs.get(RETRY_OF) for t in trials} - {None}
    return sum(
        t.state.is_finished() and not t.user_attrs.get(REQUEUED) and t.number not in rerun
        for t in trials
    )


def budgeted(trials) -> int:
    """Trials that count against a study's ``trials``: those ``counted`` counts, less the
    pruned (which count against its cap alone)."""
    trials = list(trials)
    pruned = sum(t.state == TrialState.PRUNED for t in trials)
    return counted(trials) - pruned
