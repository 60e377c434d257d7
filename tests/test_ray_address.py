"""Which Ray cluster trials run on (autotune.studies.cluster, init_ray): --ray-address,
then RAY_ADDRESS, then a cluster `ray start` left running, else a local instance; a bad
address fails in one line within seconds; resources are passed only to an instance
autotune starts. The fast tests record ray.init's arguments instead of starting Ray."""

from __future__ import annotations

import socket
import sys
import threading

import pytest
from typer.testing import CliRunner

from autotune.errors import AutotuneError
from autotune.studies import cluster


@pytest.fixture(autouse=True)
def no_ray_environment(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "_running_local_cluster", lambda: None)
    monkeypatch.setattr(cluster, "GCS_TIMEOUT_S", 0.5)


def refused_address() -> str:
    """An address nothing listens on (a port just given back by the kernel)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def silent_server():
    """A port that accepts connections and never answers: Ray would wait for minutes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in accepted:
        conn.close()


@pytest.fixture
def ray_init(monkeypatch):
    """ray.init replaced by a recorder (no Ray is started)."""
    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    return calls


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("address", ["nonsense", "host:port", "host:0", ":6379"])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(AutotuneError) as exc:
        cluster.ray_target(address)
    assert "HOST:PORT" in one_line(exc) and "--ray-address" in str(exc.value)


def test_an_address_nobody_listens_on_fails_in_one_line():
    address = refused_address()
    with pytest.raises(AutotuneError) as exc:
        cluster.ray_target(address)
    line = one_line(exc)
    assert address in line and "ray start --head" in line and "--ray-address" in line


def test_a_port_that_is_not_a_ray_head_fails_instead_of_hanging(silent_server):
    with pytest.raises(AutotuneError) as exc:
        cluster.ray_target(silent_server)
    assert "not a Ray head node" in one_line(exc)


def test_ray_address_from_the_environment_is_checked_and_named(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", refused_address())
    with pytest.raises(AutotuneError) as exc:
        cluster.ray_target(None)
    line = one_line(exc)
    assert "(RAY_ADDRESS)" in line and "unset RAY_ADDRESS" in line


def test_joining_a_cluster_passes_no_resources(monkeypatch, ray_init, silent_server):
    from autotune.studies.tune import init_ray

    monkeypatch.setattr(cluster, "_not_a_gcs", lambda address: None)  # a head answers
    monkeypatch.setenv("RAY_ADDRESS", silent_server)
    init_ray()
    init_ray(silent_server)
    assert [call["address"] for call in ray_init] == [silent_server, silent_server]
    for call in ray_init:
        assert "num_cpus" not in call and "num_gpus" not in call
        assert call["log_to_driver"] is False


def test_the_option_wins_over_the_environment(monkeypatch, ray_init):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    target = cluster.ray_target("local")
    assert target.local and target.source == "local"


def test_a_local_instance_gets_this_machines_cores_and_no_dashboard(ray_init):
    import os

    from autotune.studies.tune import init_ray

    init_ray()
    (call,) = ray_init
    assert call["address"] == "local"  # not a cluster file that `ray start` left behind
    assert call["num_cpus"] == os.cpu_count() and call["include_dashboard"] is False
    assert call["log_to_driver"] is False


def test_a_running_local_cluster_is_joined_and_a_dead_one_is_not(monkeypatch, silent_server):
    monkeypatch.setattr(cluster, "_not_a_gcs", lambda address: None)
    monkeypatch.setattr(cluster, "_running_local_cluster", lambda: silent_server)
    target = cluster.ray_target(None)
    assert target.address == silent_server and not target.local
    dead = refused_address()
    monkeypatch.setattr(cluster, "_running_local_cluster", lambda: dead)
    assert cluster.ray_target(None).local
    with pytest.raises(AutotuneError, match="no Ray cluster runs on this machine"):
        cluster.ray_target("auto")


def test_ray_init_failing_is_one_line(monkeypatch):
    import ray

    from autotune.studies.tune import init_ray

    def fail(**kwargs):
        raise RuntimeError("Version mismatch: the cluster runs Ray 2.9\nand more lines")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fail)
    monkeypatch.setattr(cluster, "_not_a_gcs", lambda address: None)
    monkeypatch.setattr(cluster, "_unreachable", lambda address: None)
    with pytest.raises(AutotuneError) as exc:
        init_ray("10.0.0.1:6379")
    line = one_line(exc)
    assert "Version mismatch" in line and "10.0.0.1:6379" in line


def test_profile_checks_the_address_before_any_long_work(monkeypatch, tmp_path):
    import autotune.models
    from autotune.cli import app

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(autotune.models, "load_target", refuse)
    monkeypatch.chdir(tmp_path)
    address = refused_address()
    result = CliRunner().invoke(
        app, ["profile", "--ray-address", address, "--device", "cpu", "--methods", "self_spec"]
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and address in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written


# --- a real cluster (ray tier) -----------------------------------------------------------


def square(config: dict) -> dict:  # runs in Ray workers: shipped by value
    return {"objective": -(float(config["x"] - 2) ** 2)}


@pytest.mark.ray
def test_ray_address_joins_a_running_cluster_and_one_count_is_shown(monkeypatch, tmp_path, capsys):
    """RAY_ADDRESS set (what made init_ray(num_cpus=...) raise): the cluster is joined;
    Ray's banner, with its own "Number of trials", is not shown; the bar counts the
    study's trials."""
    import optuna
    import ray
    from optuna.distributions import IntDistribution
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from autotune.studies.tune import StudySpec, init_ray, run_study

    monkeypatch.setattr(cluster, "GCS_TIMEOUT_S", 2.0)
    monkeypatch.setenv("AUTOTUNE_RAY_RESULTS", str(tmp_path / "ray-results"))
    if ray.is_initialized():
        ray.shutdown()
    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        assert cluster.reachable(head.address)
        monkeypatch.setenv("RAY_ADDRESS", head.address)
        init_ray()
        assert ray.cluster_resources()["CPU"] == 1  # the head's, not this machine's count
        spec = StudySpec(
            name="tiny/square",
            storage_url=f"sqlite:///{tmp_path / 'studies.db'}",
            space={"x": IntDistribution(0, 4)},
            metric="objective",
            trials=3,
            sampler=optuna.samplers.RandomSampler(seed=0),
            user_attrs={"objective": "minus squared distance"},
        )
        capsys.readouterr()
        study = run_study(spec, square, label="square")
        out, err = capsys.readouterr()
        assert len(study.trials) == 3
        assert "Number of trials" not in out + err
        assert out == ""  # stdout stays for results
        assert "3/3" in err and "/7" not in err  # num_samples (7 here) is never shown
        assert study.metric_names == ["minus squared distance"]
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()
        head.shutdown()
