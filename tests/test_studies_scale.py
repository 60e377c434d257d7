"""Studies at scale: PostgreSQL, workers side by side, processes side by side, faults.

Everything runs on one Ray cluster of this machine, started once for the module: a head
node of 2 CPUs, joined for the node-fault test by a second node that the test kills.
PostgreSQL tests need ``$AUTOTUNE_TEST_POSTGRES`` (``scripts/start_test_postgres.sh``
starts a throwaway server; ``.ci/run`` does): without it they are skipped, except in CI
(``$CI`` set), where they fail.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import optuna
import pytest
import study_objectives
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState
from study_objectives import Slow, TinyTarget, faulty, value_of

POSTGRES = "AUTOTUNE_TEST_POSTGRES"
SPACE = {"x": IntDistribution(0, 6), "y": FloatDistribution(0.0, 1.0)}
OPTIMUM = {"x": 3, "y": 0.5}


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray cluster of this machine (head node: 2 CPUs); the driver is this process."""
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from autotune.studies.tune import init_ray

    results = tmp_path_factory.mktemp("ray-results")
    before = os.environ.get("AUTOTUNE_RAY_RESULTS")
    os.environ["AUTOTUNE_RAY_RESULTS"] = str(results)
    if ray.is_initialized():
        ray.shutdown()
    # a dead node is noticed within a few seconds
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    init_ray(cluster.address)
    # the workers cannot import the tests' modules: ship this one's and the objectives by value
    shipped = (sys.modules[__name__], study_objectives)
    for module in shipped:
        cloudpickle.register_pickle_by_value(module)
    cluster.results = results
    yield cluster
    for module in shipped:
        cloudpickle.unregister_pickle_by_value(module)
    ray.shutdown()
    cluster.shutdown()
    if before is None:
        os.environ.pop("AUTOTUNE_RAY_RESULTS", None)
    else:
        os.environ["AUTOTUNE_RAY_RESULTS"] = before


def postgres_url() -> str:
    url = os.environ.get(POSTGRES)
    if url:
        return url
    if os.environ.get("CI"):
        pytest.fail(f"${POSTGRES} is not set: .ci/run starts the test PostgreSQL server")
    pytest.skip(f"no test PostgreSQL server (${POSTGRES}; scripts/start_test_postgres.sh)")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies.db'}"
    return postgres_url()


def study_name(label: str) -> str:
    return f"scale-{uuid.uuid4().hex[:8]}/{label}"


def spec(url: str, name: str, trials: int, seeds=(), seed: int = 0, timed: bool = False):
    from autotune.studies.tune import StudySpec

    return StudySpec(
        name=name,
        storage_url=url,
        space=SPACE,
        metric="objective",
        trials=trials,
        sampler=optuna.samplers.RandomSampler(seed=seed),
        seeds=list(seeds),
        timed=timed,
    )


@functools.cache
def storage_for(url: str):
    from autotune.studies.storage import open_storage

    return open_storage(url)


def load(url: str, name: str) -> list:
    return optuna.load_study(study_name=name, storage=storage_for(url)).get_trials()


def counted(trials) -> int:
    from autotune.studies.trials import counted as count

    return count(trials)


def overlap(a, b) -> bool:
    return (
        a.user_attrs["start"] < b.user_attrs["end"] and b.user_attrs["start"] < a.user_attrs["end"]
    )


def files_containing(folder: Path, needle: bytes) -> list[str]:
    hits = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root, name)
            try:
                if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                pass
    return hits


def check_no_password_on_disk(url: str, cluster) -> None:
    from sqlalchemy.engine import make_url

    password = make_url(url).password
    assert password and len(password) >= 6
    folders = [cluster.results, Path(cluster.head_node.get_session_dir_path())]
    for folder in folders:
        assert not files_containing(folder, password.encode()), folder
    assert any(Path(cluster.results).rglob("tuner.pkl"))  # Ray did write its state there


# --- (a) PostgreSQL, two workers side by side, the target loaded once per worker ------


@pytest.mark.ray
def test_postgres_study_with_two_workers(cluster, tiny_llama_dir, tmp_path):
    from autotune.models.ref import TargetRef
    from autotune.studies.tune import run_study
    from autotune.studies.workers import Workers

    url = postgres_url()
    name = study_name("tiny-target")
    ref = TargetRef.for_user(str(tiny_llama_dir))
    marks = tmp_path / "marks"
    marks.mkdir()
    run_study(
        spec(url, name, 6, seeds=[OPTIMUM]),
        TinyTarget(ref, str(marks)),
        label="two workers",
        workers=Workers(count=2),
    )
    trials = load(url, name)
    assert len(trials) == 6
    assert all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        assert t.value == pytest.approx(value_of(t.params))
        assert t.user_attrs["target_loads"] == 1  # loaded once per worker, kept
    workers = {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2  # 6 trials on 2 long-lived workers
    assert any(overlap(a, b) for a in trials for b in trials if a.number < b.number)
    assert optuna.load_study(study_name=name, storage=storage_for(url)).best_params == OPTIMUM
    # (f) the database password reached no file of Ray's
    check_no_password_on_disk(url, cluster)


# --- (e) NaN, crash, out of memory, a dead worker: failed with reason, study goes on ----


@pytest.mark.ray
def test_faults_are_recorded_and_the_study_goes_on(cluster, database):
    from autotune.studies.tune import run_study
    from autotune.studies.workers import Workers

    name = study_name("faults")
    seeds = [{"x": x, "y": 0.1 * x} for x in (1, 2, 3, 4, 5, 0)]
    run_study(
        spec(database, name, 6, seeds=seeds), faulty, label="faults", workers=Workers(count=2)
    )
    trials = load(database, name)
    assert not [t for t in trials if not t.state.is_finished()]
    by_x = {}
    for t in trials:
        by_x.setdefault(t.params["x"], []).append(t)
    reason = {x: ts[0].user_attrs.get("fail_reason", "") for x, ts in by_x.items()}
    assert by_x[1][0].state == TrialState.FAIL and "nan" in reason[1]
    assert by_x[2][0].state == TrialState.FAIL and "RuntimeError: boom at x=2" in reason[2]
    assert by_x[3][0].state == TrialState.FAIL
    assert reason[3].startswith("out of memory: MemoryError: cannot allocate")
    # the dead worker: failed, queued once more, died again, and that one counts
    first, retry = sorted(by_x[4], key=lambda t: t.number)
    assert first.state == retry.state == TrialState.FAIL
    assert "died" in first.user_attrs["fail_reason"] and first.user_attrs["requeued"] is True
    assert retry.user_attrs["retry_of"] == first.number and "requeued" not in retry.user_attrs
    assert "died" in retry.user_attrs["fail_reason"]
    # the study went on
    assert by_x[5][0].state == TrialState.COMPLETE and by_x[5][0].value == 5.0
    assert by_x[0][0].state == TrialState.COMPLETE and by_x[0][0].value == 0.0
    assert counted(trials) == 6 and len(trials) == 7
    report("faults", trials)


# --- (b) two processes on one study -------------------------------------------------

DRIVER = """
import os, sys, time
import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from autotune.studies.tune import StudySpec, run_study
from autotune.studies.workers import Workers

url = os.environ["AUTOTUNE_STORAGE"]  # not on the command line: it holds the password
name, trials, seed, seconds, address = sys.argv[1:6]

def objective(config):
    time.sleep(float(seconds))
    return {"objective": -(config["x"] - 3) ** 2 - (config["y"] - 0.5) ** 2}

spec = StudySpec(name=name, storage_url=url, metric="objective", trials=int(trials),
                 space={"x": IntDistribution(0, 6), "y": FloatDistribution(0.0, 1.0)},
                 sampler=optuna.samplers.RandomSampler(seed=int(seed)))
run_study(spec, objective, label="driver " + seed, workers=Workers(count=2, ray_address=address))
"""


def start_driver(cluster, url: str, name: str, trials: int, seed: int, seconds: float):
    """`run_study` in a process of its own, joined to the module's cluster."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", AUTOTUNE_STORAGE=url)
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, name, str(trials), str(seed), str(seconds), cluster.address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C reaches it even where this process was started in the
        # background (where SIGINT is ignored, and so in its children)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(driver, url: str, name: str, timeout: float = 150) -> None:
    try:
        _, err = driver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, err = driver.communicate()
        states = [(t.number, t.state.name, owner_pid(t)) for t in load_if_any(url, name)]
        pytest.fail(
            f"driver {driver.pid} still running after {timeout} s; trials {states}; "
            f"stderr: {err[-2000:]}"
        )
    assert driver.returncode == 0, err[-3000:]


def owner_pid(trial) -> int | None:
    return (trial.user_attrs.get("owner") or {}).get("pid")


@pytest.mark.ray
def test_two_processes_share_one_study(cluster, database):
    name = study_name("shared")
    budget = 12
    drivers = [start_driver(cluster, database, name, budget, seed, 0.6) for seed in (1, 2)]
    for driver in drivers:
        finish(driver, database, name)
    trials = load(database, name)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) == len(trials)  # no collisions
    assert not [t for t in trials if not t.state.is_finished()]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    per_process = {d.pid: sum(owner_pid(t) == d.pid for t in trials) for d in drivers}
    assert sum(per_process.values()) == len(trials)  # every trial is someone's
    assert all(per_process.values()), per_process  # both took part
    # the budget is the study's: together they ran it (give or take a simultaneous ask)
    assert budget <= len(trials) <= budget + 2
    report("two processes", trials, per_process=per_process)


# --- (c) a process killed mid-study; the next run resumes ----------------------------


def interrupt_mid_study(cluster, url: str, name: str, budget: int, how: int):
    """Start a run of the study in a process of its own; once it has finished trials and
    holds running ones, send it ``how``; return its pid and the trials as they were."""
    driver = start_driver(cluster, url, name, budget, 1, 2.0)
    deadline = time.monotonic() + 120
    while True:
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the first run finished no trial in time"
        states = [t.state for t in load_if_any(url, name)]
        if states.count(TrialState.COMPLETE) >= 2 and TrialState.RUNNING in states:
            break
        time.sleep(0.2)
    os.kill(driver.pid, how)
    driver.communicate(timeout=60)
    assert driver.returncode != 0
    return driver.pid, load(url, name)


def resume_and_check(
    url: str, name: str, budget: int, before: list, cut: list, reason: str
) -> list:
    """Run the study again: the finished trials are kept and not repeated; the ``cut``
    ones are failed with ``reason`` and re-run once each; the budget is met exactly."""
    from autotune.studies.tune import run_study
    from autotune.studies.workers import Workers

    finished = {t.number: (t.params, t.value) for t in before if t.state == TrialState.COMPLETE}
    assert cut and finished
    run_study(spec(url, name, budget, seed=2), Slow(0.2), label="resumed", workers=Workers(count=2))
    after = {t.number: t for t in load(url, name)}
    for number, (params, value) in finished.items():
        assert after[number].state == TrialState.COMPLETE
        assert (after[number].params, after[number].value) == (params, value)
        assert sum(t.params == params for t in after.values()) == 1
    for trial in cut:
        failed = after[trial.number]
        why = failed.user_attrs["fail_reason"]
        # killed in the moment between taking up a queued trial and naming its owner: the
        # trial has a heartbeat, and is failed once its grace period is over
        unclaimed = "owner" not in failed.user_attrs and "no heartbeat" in why
        assert failed.state == TrialState.FAIL and (reason in why or unclaimed), why
        reruns = [t for t in after.values() if t.user_attrs.get("retry_of") == trial.number]
        if not trial.params:  # cut before its parameters were written: nothing to re-run
            assert "requeued" not in failed.user_attrs and not reruns
            continue
        assert failed.user_attrs["requeued"] is True
        assert len(reruns) == 1 and reruns[0].state == TrialState.COMPLETE
        assert trial.params.items() <= reruns[0].params.items()
    assert not [t for t in after.values() if not t.state.is_finished()]
    assert counted(after.values()) == budget
    return list(after.values())


@pytest.mark.ray
def test_resume_after_a_killed_process(cluster, database):
    """SIGKILL: the process leaves its trials RUNNING; the next run fails them."""
    name, budget = study_name("killed"), 10
    pid, before = interrupt_mid_study(cluster, database, name, budget, signal.SIGKILL)
    stale = [t for t in before if t.state == TrialState.RUNNING]
    after = resume_and_check(
        database, name, budget, before, stale, f"process {pid} on {socket.gethostname()} is gone"
    )
    report(
        "resume after SIGKILL",
        after,
        killed_running=len(stale),
        finished_before_kill=sum(t.state == TrialState.COMPLETE for t in before),
    )


@pytest.mark.ray
def test_resume_after_ctrl_c(cluster, tmp_path):
    """Ctrl-C: the process stops (Tune does not swallow it), failing and queueing again
    the trials it had under way."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    name, budget = study_name("ctrl-c"), 10
    _, before = interrupt_mid_study(cluster, url, name, budget, signal.SIGINT)
    stopped = [t for t in before if t.user_attrs.get("requeued")]
    assert stopped and all(
        "stopped before it finished" in t.user_attrs["fail_reason"] for t in stopped
    )
    assert len([t for t in before if t.state == TrialState.WAITING]) == len(stopped)
    # (a Ctrl-C that lands between two writes may leave a trial RUNNING: the next run
    # fails it as left by an interrupted run)
    cut = stopped + [t for t in before if t.state == TrialState.RUNNING]
    after = resume_and_check(url, name, budget, before, cut, "interrupted")
    report(
        "resume after Ctrl-C",
        after,
        stopped=len(stopped),
        finished_before_stop=sum(t.state == TrialState.COMPLETE for t in before),
    )


def load_if_any(url: str, name: str) -> list:
    try:
        return load(url, name)
    except KeyError:  # not created yet
        return []


# --- (d) a worker node dies mid-study ----------------------------------------------


@pytest.mark.ray
def test_worker_node_killed_mid_study(cluster, tmp_path):
    from autotune.studies.tune import run_study
    from autotune.studies.workers import Workers

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    name = study_name("node-lost")
    marks = tmp_path / "marks"
    marks.mkdir()
    victim = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    killed = threading.Event()

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if any(p.name.startswith(victim.node_id) for p in marks.iterdir()):
                # its trial has started and takes 2 s: it is mid-trial now
                cluster.remove_node(victim, allow_graceful=False)
                killed.set()
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    budget = 8
    run_study(
        spec(url, name, budget, seeds=[OPTIMUM]),
        Slow(2.0, str(marks)),
        label="node lost",
        workers=Workers(count=3, cpus_per_trial=1),
    )
    killer.join(timeout=5)
    assert killed.is_set(), "no trial ran on the second node"
    trials = load(url, name)
    assert not [t for t in trials if not t.state.is_finished()]
    lost = [t for t in trials if t.state == TrialState.FAIL]
    assert lost  # the trial on the dead node
    for t in lost:  # failed with reason, re-run
        assert "died" in t.user_attrs["fail_reason"] and t.user_attrs["requeued"] is True
        rerun = [r for r in trials if r.user_attrs.get("retry_of") == t.number]
        assert len(rerun) == 1 and rerun[0].state == TrialState.COMPLETE
        assert rerun[0].params == t.params
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == counted(trials) == budget  # every trial accounted for
    study = optuna.load_study(study_name=name, storage=storage_for(url))
    assert study.best_params == OPTIMUM and study.best_value == pytest.approx(0.0)
    report("worker node killed", trials)


# --- `autotune profile --workers 2 --storage postgresql://...` ----------------------

SMALL_SPACE = """\
skip_mask: {keep_first: 1, keep_last: 1}
calibration: {prompts: 2, tokens: 12}
trials: {prompts: 2, tokens: 8}
draft_exit: {trials: 2}
"""


@pytest.mark.ray
def test_profile_with_two_workers_on_postgres(cluster, tmp_path, tiny_llama_dir, run_autotune):
    from autotune.profile.io import read_profile

    url = postgres_url()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Tell me about the number {i}."}) + "\n" for i in range(8))
    )
    space = tmp_path / "space.yaml"
    space.write_text(SMALL_SPACE)
    # a model folder of its own name, so that its studies are this test's alone
    model = tmp_path / f"tiny-{uuid.uuid4().hex[:8]}"
    tiny_llama_dir.rename(model)
    args = [
        "profile",
        "--model",
        model,
        "--workers",
        2,
        "--storage",
        url,
        "--ray-address",
        cluster.address,
        "--trials",
        6,
        "--time-budget",
        120,
        "--prompts",
        prompts,
        "--methods",
        "self_spec",
        "--search-space",
        f"self_spec={space}",
        "--threads",
        1,
        "--heldback-prompts",
        2,
        "--max-new-tokens",
        12,
        "--out",
        tmp_path / "p.yaml",
    ]
    done = run_autotune(args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert read_profile(tmp_path / "p.yaml").methods.self_spec.measured.lossless is True
    masks = load(url, f"{model.name}/self_spec/skip_mask")
    assert len(masks) == 6 and all(t.state == TrialState.COMPLETE for t in masks)
    assert all(t.user_attrs["target_loads"] == 1 for t in masks)
    assert len({t.user_attrs["worker"] for t in masks}) == 2
    # again: the answers and the finished trials are reused, nothing is repeated
    again = run_autotune(args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing the model's answers" in again.stderr + again.stdout
    assert [(t.number, t.params) for t in load(url, f"{model.name}/self_spec/skip_mask")] == [
        (t.number, t.params) for t in masks
    ]


def report(label: str, trials, **extra) -> None:
    """One line per fault test (shown with -s): trials run, failed and re-run."""
    trials = list(trials)
    print(
        f"\n[{label}] "
        + json.dumps(
            {
                "trials": len(trials),
                "complete": sum(t.state == TrialState.COMPLETE for t in trials),
                "failed": sum(t.state == TrialState.FAIL for t in trials),
                "failed_then_rerun": sum(bool(t.user_attrs.get("requeued")) for t in trials),
                "reruns": sum("retry_of" in t.user_attrs for t in trials),
                **extra,
            }
        )
    )
