"""The studies' rules that need no Ray: how many trials run side by side and with what
resources, when a running trial is stale, and a PostgreSQL storage pickled without its
password."""

from __future__ import annotations

import os

import optuna
import pytest
from optuna.trial import TrialState


def test_trial_resources_rule():
    from autotune.studies.workers import Workers, trial_resources

    machine = [{"CPU": 8.0}]
    # a timed CPU trial has a machine to itself: one at a time per machine
    assert trial_resources(Workers(), True, machine) == ({"cpu": 8.0}, 1)
    assert trial_resources(Workers(count=2), True, machine) == ({"cpu": 8.0}, 1)
    assert trial_resources(Workers(count=2), True, machine * 2) == ({"cpu": 8.0}, 2)
    # a proxy trial gets an equal share of the cores
    assert trial_resources(Workers(count=4), False, machine) == ({"cpu": 2.0}, 4)
    assert trial_resources(Workers(count=16), False, machine) == ({"cpu": 1.0}, 8)
    # cores given by hand; never more than the largest machine has
    assert trial_resources(Workers(count=3, cpus_per_trial=1), True, machine) == ({"cpu": 1}, 3)
    assert trial_resources(Workers(cpus_per_trial=32), True, machine) == ({"cpu": 8.0}, 1)
    # with GPUs: a GPU set and one core each, side by side
    gpus = [{"CPU": 16.0, "GPU": 2.0}]
    assert trial_resources(Workers(count=4, gpus_per_trial=1), True, gpus) == (
        {"cpu": 1.0, "gpu": 1},
        2,
    )


def running_trial(user_attrs: dict, started=None):
    from datetime import datetime

    return optuna.trial.FrozenTrial(
        number=0,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=started or datetime.now(),
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs=user_attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=0,
    )


def test_stale_reason_rules():
    import psutil

    from autotune.studies.trials import GRACE_S, stale_reason, this_process

    # unknown owner: the storage's heartbeat alone decides
    assert stale_reason(running_trial({})) is None
    assert "no heartbeat" in stale_reason(running_trial({}), late=True)
    me = this_process()
    assert stale_reason(running_trial({"owner": me}), late=True) is None
    parent = psutil.Process(os.getppid())
    alive = dict(me, pid=parent.pid, started=round(parent.create_time(), 2))
    assert stale_reason(running_trial({"owner": alive}), late=True) is None
    gone = dict(alive, started=alive["started"] - 1000.0)  # that pid, but another process
    assert "is gone" in stale_reason(running_trial({"owner": gone}))
    # another pid namespace (a container) on this machine: judged by its heartbeat alone
    assert stale_reason(running_trial({"owner": dict(gone, pidns=-1)})) is None
    # another machine, whatever its host name: judged by its heartbeat alone
    elsewhere = dict(gone, boot="another-boot")
    assert stale_reason(running_trial({"owner": elsewhere})) is None
    late = stale_reason(running_trial({"owner": elsewhere}), late=True, grace=GRACE_S)
    assert f"no heartbeat from {me['host']} for over {GRACE_S} s" in late


def test_storage_pickles_without_password():
    """Ray pickles the searcher, and so the storage, into its experiment folder."""
    import pickle

    from autotune.studies.rdb import RDBStorage, redact

    url = "postgresql://autotune:Pa55-not-pickled@127.0.0.1:5432/autotune"
    storage = RDBStorage.__new__(RDBStorage)  # its state, without a server to connect to
    storage.__dict__.update(
        url=url, engine_kwargs={}, scoped_session=None, engine=None, _version_manager=None
    )
    state = storage.__getstate__()
    assert state["url"] == redact(url) == "postgresql://autotune:***@127.0.0.1:5432/autotune"
    assert b"Pa55-not-pickled" not in pickle.dumps(state)
    restored = RDBStorage.__new__(RDBStorage)
    # unpickled in this process, it gets its password back (and then fails to connect:
    # no server listens there, whichever driver error that raises)
    with pytest.raises(Exception):  # noqa: B017
        restored.__setstate__(state)
    assert restored.url == url
