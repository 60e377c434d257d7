"""Stale trials across hosts (autotune.studies.trials): Optuna's storage heartbeat, stamped
with the database's clock, decides for trials of other machines; a trial whose owner
provably is gone on this machine is failed at once. Two "hosts" are two storage objects
on one SQLite file, with a heartbeat of 1 s and a grace period of 1 s."""

from __future__ import annotations

import time
import warnings

import optuna
import pytest
from optuna.trial import TrialState

from autotune.studies import trials as held
from autotune.studies.rdb import connect

# Optuna's ask() warns that a heartbeat is meant for study.optimize: Ray's searcher asks
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")
DEADLINE_S = 20.0  # polling bound only: SQLite stamps heartbeats to the second


def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


def host(tmp_path, grace_s: int = 1):
    """One machine's view of the study database."""
    return connect(url(tmp_path), heartbeat_s=1, grace_s=grace_s)


def elsewhere(**changes) -> dict:
    """An owner on another machine: same host name, same PID-namespace inode and a pid
    that does not run here (what the old rule took for a dead local process); only its
    kernel boot differs."""
    return {**held.this_process(), "boot": "another-machine", "pid": 2**22 + 7, **changes}


SPACE = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def asked(study, x: float, owner: dict | None) -> optuna.trial.FrozenTrial:
    """A trial with parameter ``x``, taken up here, then said to be ``owner``'s."""
    study.enqueue_trial({"x": x})
    trial = study.ask(SPACE)
    if owner is not None:
        study._storage.set_trial_user_attr(trial._trial_id, held.OWNER, owner)
    return study._storage.get_trial(trial._trial_id)


def state(storage, study_name: str, number: int) -> optuna.trial.FrozenTrial:
    return optuna.load_study(study_name=study_name, storage=storage).trials[number]


def test_a_silent_trial_of_another_host_is_failed_and_rerun_a_beating_one_is_not(tmp_path):
    a, b = host(tmp_path), host(tmp_path)
    study_a = optuna.create_study(study_name="shared", storage=a, direction="maximize")
    dead = asked(study_a, 0.25, elsewhere(host="host-a"))
    live = asked(study_a, 0.75, elsewhere(host="host-a"))
    # a trial an older autotune (or another tool) left running: no owner, no heartbeat
    plain = optuna.storages.RDBStorage(url(tmp_path))
    legacy = optuna.load_study(study_name="shared", storage=plain).ask(SPACE)
    study_b = optuna.load_study(study_name="shared", storage=b)

    # fresh heartbeats: nothing is stale, and the legacy trial is adopted, not failed
    assert held.fail_stale_trials(study_b) == 0
    deadline = time.monotonic() + DEADLINE_S
    while state(b, "shared", dead.number).state == TrialState.RUNNING:
        assert time.monotonic() < deadline, "the silent trial was never failed"
        held.beat(a, [live._trial_id])  # host A holds `live` only
        held.fail_stale_trials(study_b)
        time.sleep(0.2)
    held.beat(a, [live._trial_id])
    held.fail_stale_trials(study_b)

    failed = state(b, "shared", dead.number)
    assert failed.state == TrialState.FAIL
    assert "no heartbeat from host-a" in failed.user_attrs[held.FAIL_REASON]
    assert state(b, "shared", live.number).state == TrialState.RUNNING
    trials = optuna.load_study(study_name="shared", storage=b).trials
    reruns = [t for t in trials if t.user_attrs.get(held.RETRY_OF) == dead.number]
    assert len(reruns) == 1 and reruns[0].state == TrialState.WAITING
    # the failed trial does not count against the budget; its re-run will
    assert held.counted(trials) == 0
    # host A finds nothing left to do, and the live trial is still A's to finish
    assert held.fail_stale_trials(study_a) == 0
    study_a.tell(live.number, 1.0)
    assert state(a, "shared", live.number).state == TrialState.COMPLETE
    # the next trial asked for, on either host, re-runs the failed one's parameters
    rerun = study_b.ask(SPACE)
    assert rerun.params == {"x": 0.25} and rerun.number == reruns[0].number

    # the adopted legacy trial turns stale in its turn, since nobody beats it
    deadline = time.monotonic() + DEADLINE_S
    while state(b, "shared", legacy.number).state == TrialState.RUNNING:
        assert time.monotonic() < deadline, "the adopted trial was never failed"
        held.fail_stale_trials(study_b)
        time.sleep(0.2)
    assert "no heartbeat" in state(b, "shared", legacy.number).user_attrs[held.FAIL_REASON]


def test_optunas_own_scan_requeues_through_our_callback(tmp_path):
    """`study.optimize` runs Optuna's own stale scan: its callback queues the trial again."""
    a, b = host(tmp_path), host(tmp_path)
    study_a = optuna.create_study(study_name="s", storage=a)
    dead = asked(study_a, 0.5, elsewhere())
    study_b = optuna.load_study(study_name="s", storage=b)
    deadline = time.monotonic() + DEADLINE_S
    while state(b, "s", dead.number).state == TrialState.RUNNING:
        assert time.monotonic() < deadline, "Optuna's scan never failed the silent trial"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study_b)
        time.sleep(0.2)
    trials = optuna.load_study(study_name="s", storage=b).trials
    assert [t.user_attrs.get(held.RETRY_OF) for t in trials] == [None, dead.number]
    assert held.counted(trials) == 0
    assert study_b.ask(SPACE).params == {"x": 0.5}


def test_another_machine_with_this_host_name_is_judged_by_heartbeat_only(tmp_path):
    """The old rule took a pid that does not run here, under this host name and PID
    namespace, for a dead process of this machine: two hosts failed each other's trials."""
    study = optuna.create_study(study_name="s", storage=host(tmp_path, grace_s=60))
    trial = asked(study, 0.5, elsewhere())
    assert held.owner_alive(trial.user_attrs[held.OWNER]) is None
    assert held.stale_reason(trial) is None
    assert held.fail_stale_trials(study) == 0
    assert state(study._storage, "s", trial.number).state == TrialState.RUNNING


def test_a_gone_process_of_this_machine_is_failed_at_once(tmp_path):
    """No need to wait for the grace period after Ctrl-C or a kill on this machine."""
    study = optuna.create_study(study_name="s", storage=host(tmp_path, grace_s=600))
    mine = asked(study, 0.1, None)  # asked here: owned by this process from the start
    gone = asked(study, 0.2, {**held.this_process(), "pid": 2**22 + 7, "started": 1.0})
    assert held.owner_alive(mine.user_attrs[held.OWNER]) is True
    assert held.fail_stale_trials(study) == 1
    reason = state(study._storage, "s", gone.number).user_attrs[held.FAIL_REASON]
    assert f"process {2**22 + 7}" in reason and "is gone" in reason
    assert state(study._storage, "s", mine.number).state == TrialState.RUNNING


def test_storages_without_a_heartbeat_keep_the_owner_rule():
    study = optuna.create_study()  # in memory: no heartbeat
    mine = study.ask()
    left = study.ask()
    study._storage.set_trial_user_attr(
        left._trial_id, held.OWNER, {**held.this_process(), "pid": 2**22 + 7, "started": 1.0}
    )
    assert not held.heartbeat_enabled(study._storage)
    assert held.fail_stale_trials(study) == 1
    assert study.trials[mine.number].state == TrialState.RUNNING
    assert study.trials[left.number].state == TrialState.FAIL


def test_taking_up_a_queued_trial_beats_for_it(tmp_path):
    """An enqueued trial is never RUNNING without a heartbeat (else a scan elsewhere could
    not tell it from one left behind)."""
    storage = host(tmp_path, grace_s=60)
    study = optuna.create_study(study_name="s", storage=storage)
    study.enqueue_trial({"x": 0.5})
    trial = study.ask(SPACE)
    assert trial.params == {"x": 0.5}
    owner = storage.get_trial(trial._trial_id).user_attrs[held.OWNER]
    assert held.owner_alive(owner) is True
    # a heartbeat row exists: adopting finds nothing to do, and the trial is not stale
    beats = _heartbeat_rows(storage)
    storage.adopt_unbeaten([trial._trial_id])
    assert _heartbeat_rows(storage) == beats and trial._trial_id in beats


def _heartbeat_rows(storage) -> set[int]:
    import sqlalchemy as sa

    with storage.engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT trial_id FROM trial_heartbeats")).scalars())
