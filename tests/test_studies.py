"""Study database and Ray Tune orchestration (autotune/studies)."""

from __future__ import annotations

import math
import os
import sys

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.errors import StorageError
from autotune.studies.database import storage_url
from autotune.studies.storage import MeasurementCache, open_storage

SPACE = {"x": IntDistribution(0, 6), "y": FloatDistribution(0.0, 1.0)}


# Objectives run in Ray workers: module-level, picklable, cheap.


def quadratic(config: dict) -> dict:
    value = -((config["x"] - 3) ** 2) - (config["y"] - 0.5) ** 2
    return {"objective": value, "x_seen": config["x"], "note": "ok"}


def flaky(config: dict) -> dict:
    if config["x"] == 2:
        return {"objective": math.nan}
    if config["x"] == 4:
        raise ValueError("boom at x=4")
    return {"objective": float(config["x"])}


@pytest.fixture(scope="module")
def ray_session():
    """One Ray instance for the whole module (starting one takes 10-20 s)."""
    import ray
    from ray import cloudpickle

    from autotune.studies.tune import init_ray

    # the workers cannot import this test module: ship its functions by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    init_ray()
    yield
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def spec(tmp_path, name: str, trials: int, seeds=()):
    from autotune.studies.tune import StudySpec

    return StudySpec(
        name=name,
        storage_url=f"sqlite:///{tmp_path / 'studies.db'}",
        space=SPACE,
        metric="objective",
        trials=trials,
        sampler=optuna.samplers.RandomSampler(seed=0),
        seeds=list(seeds),
        user_attrs={"method": "test"},
    )


def load(tmp_path, name: str):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'studies.db'}")


@pytest.mark.ray
def test_study_runs_and_resumes(tmp_path, ray_session):
    from autotune.studies.tune import run_study

    seeds = [{"x": 3, "y": 0.5}]
    study = run_study(spec(tmp_path, "tiny/quadratic", 6, seeds), quadratic, label="quadratic")
    stored = load(tmp_path, "tiny/quadratic")
    trials = stored.get_trials()
    assert len(trials) == 6
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len(study.trials) == 6
    assert stored.user_attrs["method"] == "test"
    for t in trials:
        assert t.value == pytest.approx(quadratic(t.params)["objective"])
        assert t.user_attrs["x_seen"] == t.params["x"] and t.user_attrs["note"] == "ok"
    # the seed was evaluated, and it is the optimum
    assert any(t.params == {"x": 3, "y": 0.5} for t in trials)
    assert stored.best_value == pytest.approx(0.0)
    first = [(t.number, t.params, t.value) for t in trials]

    # resume: 8 wanted, 6 done -> exactly 2 more; the seed is not repeated
    run_study(spec(tmp_path, "tiny/quadratic", 8, seeds), quadratic, label="quadratic")
    trials = load(tmp_path, "tiny/quadratic").get_trials()
    assert len(trials) == 8
    assert [(t.number, t.params, t.value) for t in trials[:6]] == first
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sum(t.params == {"x": 3, "y": 0.5} for t in trials) == 1

    # nothing left to do: returns without running a trial
    again = run_study(spec(tmp_path, "tiny/quadratic", 8, seeds), quadratic, label="quadratic")
    assert len(again.trials) == 8


@pytest.mark.ray
def test_failed_trials_are_recorded_and_study_goes_on(tmp_path, ray_session):
    from autotune.studies.tune import run_study

    seeds = [{"x": 2, "y": 0.1}, {"x": 4, "y": 0.2}, {"x": 5, "y": 0.3}, {"x": 1, "y": 0.4}]
    run_study(spec(tmp_path, "tiny/flaky", 4, seeds), flaky, label="flaky")
    trials = {t.params["x"]: t for t in load(tmp_path, "tiny/flaky").get_trials()}
    assert sorted(trials) == [1, 2, 4, 5]
    assert trials[2].state == TrialState.FAIL
    assert "nan" in trials[2].user_attrs["fail_reason"]
    assert trials[4].state == TrialState.FAIL
    assert "ValueError" in trials[4].user_attrs["fail_reason"]
    assert "boom at x=4" in trials[4].user_attrs["fail_reason"]
    # the trials after the failures ran normally
    assert trials[5].state == TrialState.COMPLETE and trials[5].value == 5.0
    assert trials[1].state == TrialState.COMPLETE and trials[1].value == 1.0
    assert not any(t.state == TrialState.RUNNING for t in trials.values())


def left_by_a_dead_process(study, trial):
    """Make ``trial`` look asked for by a process of this host that is gone."""
    from autotune.studies import trials as held

    gone = {**held.this_process(), "pid": 2**22 + 7, "started": 1.0}
    study._storage.set_trial_user_attr(trial._trial_id, held.OWNER, gone)
    return trial


@pytest.mark.ray
def test_run_study_closes_stale_trials_before_resuming(tmp_path, ray_session):
    from autotune.studies.tune import run_study

    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(study_name="tiny/stale", storage=storage, direction="maximize")
    left_by_a_dead_process(study, study.ask())
    run_study(spec(tmp_path, "tiny/stale", 3), quadratic, label="stale")
    trials = load(tmp_path, "tiny/stale").get_trials()
    assert trials[0].state == TrialState.FAIL
    assert "interrupted" in trials[0].user_attrs["fail_reason"]
    assert not any(t.state == TrialState.RUNNING for t in trials)
    assert sum(t.state == TrialState.COMPLETE for t in trials) >= 2


def test_fail_stale_trials(tmp_path):
    from autotune.studies.tune import fail_stale_trials

    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    done = study.ask()
    study.tell(done, 1.0)
    stale = left_by_a_dead_process(study, study.ask())
    assert fail_stale_trials(study) == 1
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    assert trials[stale.number].state == TrialState.FAIL
    assert trials[stale.number].user_attrs["fail_reason"]
    assert trials[done.number].state == TrialState.COMPLETE and trials[done.number].value == 1.0
    assert fail_stale_trials(study) == 0


# --- storage ------------------------------------------------------------------------


def test_storage_url_default_and_environment(monkeypatch):
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    assert storage_url() == "sqlite:///studies/autotune.db"
    monkeypatch.setenv("AUTOTUNE_STORAGE", "sqlite:////tmp/x.db")
    assert storage_url() == "sqlite:////tmp/x.db"
    assert storage_url("sqlite:///y.db") == "sqlite:///y.db"


def test_open_storage_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'nested' / 'folder' / 'x.db'}"
    storage = open_storage(url)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert (tmp_path / "nested" / "folder" / "x.db").is_file()


@pytest.mark.parametrize("url", ["notaurl", "://nothing", "sqlite:////proc/nope/x.db"])
def test_open_storage_bad_url(url):
    with pytest.raises(StorageError) as err:
        open_storage(url)
    assert "\n" not in str(err.value)


def test_open_storage_unreachable_postgres():
    with pytest.raises(StorageError) as err:
        open_storage("postgresql://user:secret@127.0.0.1:1/db")
    message = str(err.value)
    assert "\n" not in message
    assert "secret" not in message  # the password is redacted
    assert "127.0.0.1" in message


def test_measurement_cache_unreachable_postgres():
    with pytest.raises(StorageError):
        MeasurementCache("postgresql://user:secret@127.0.0.1:1/db")


def test_measurement_cache_bad_url():
    with pytest.raises(StorageError):
        MeasurementCache("notaurl")


def test_measurement_cache_round_trip(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    cache = MeasurementCache(url)
    assert cache.get("latency", "fp1", "cpu|x|2", "k") is None
    payload = {"curve": [0.1, 0.12, 0.15], "costs": {"fixed": 0.01, "attention": 0.002}}
    cache.put("latency", "fp1", "cpu|x|2", "k", payload)
    assert cache.get("latency", "fp1", "cpu|x|2", "k") == payload
    # every part of the key matters
    assert cache.get("latency", "fp2", "cpu|x|2", "k") is None
    assert cache.get("latency", "fp1", "cpu|x|1", "k") is None
    assert cache.get("continuations", "fp1", "cpu|x|2", "k") is None
    assert cache.get("latency", "fp1", "cpu|x|2", "k2") is None
    # overwrite, and read back through a fresh connection
    cache.put("latency", "fp1", "cpu|x|2", "k", [[1, 2], [3]])
    assert MeasurementCache(url).get("latency", "fp1", "cpu|x|2", "k") == [[1, 2], [3]]
    # the Optuna tables and ours live in one database
    open_storage(url)
    assert MeasurementCache(url).get("latency", "fp1", "cpu|x|2", "k") == [[1, 2], [3]]


def test_studies_package_is_not_git_ignored():
    import shutil
    import subprocess
    from pathlib import Path

    import autotune.studies.storage as module

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    source = Path(module.__file__).resolve().relative_to(root)
    ignored = subprocess.run(["git", "check-ignore", "-q", str(source)], cwd=root)
    assert ignored.returncode == 1, f"{source} is ignored by git"


def test_a_trial_is_owned_from_the_moment_it_exists(tmp_path):
    """A sampler may take seconds inside ask(); a stale-trial scan meanwhile (this
    process's own, every ~30 s) must not take the trial being sampled for an abandoned
    one. New and enqueued trials carry their owner before any sampling."""
    import optuna

    from autotune.studies import trials as held
    from autotune.studies.rdb import connect

    study = optuna.create_study(
        study_name="owned", storage=connect(f"sqlite:///{tmp_path / 'db.sqlite'}")
    )
    study.enqueue_trial({"x": 0.5})
    reasons = []

    def objective(trial):
        frozen = study._storage.get_trial(trial._trial_id)
        reasons.append(held.stale_reason(frozen))
        return trial.suggest_float("x", 0, 1)

    study.optimize(objective, n_trials=3)
    assert reasons == [None, None, None]
    assert all(t.user_attrs[held.OWNER]["pid"] == os.getpid() for t in study.trials)
