"""`autotune studies dashboard`: optuna-dashboard on the study database, started as a user
starts it (the installed command, a free port) and read back over HTTP; and the one-line
error when the optional extra is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution
from typer.testing import CliRunner

from autotune.cli import app

# Optuna's ask() warns that a heartbeat is meant for study.optimize (Ray's searcher asks)
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")
START_S = 120.0  # bound on the command's start (imports); not a timing assert
STOP_S = 120.0  # bound on stopping after Ctrl-C (a loaded machine answers slowly)


def make_study(url: str) -> None:
    """A study as `profile` opens it (its objective labelled), with two finished trials."""
    from autotune.studies.tune import StudySpec, open_study

    spec = StudySpec(
        name="tiny/medusa/abc",
        storage_url=url,
        space={"nodes": IntDistribution(1, 8)},
        metric="objective",
        trials=2,
        user_attrs={"model": "tiny", "method": "medusa", "objective": "measured speedup"},
    )
    study = open_study(spec)
    for nodes, value in ((3, 1.25), (5, 1.5)):
        trial = study.ask({"nodes": IntDistribution(1, 8)})
        trial.set_user_attr("nodes_seen", nodes)
        study.tell(trial, value)


def first_line(stream, timeout: float) -> str:
    """The first line the process writes, or "" if none comes within ``timeout``."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return line[0] if line else ""


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=90) as response:
        return json.loads(response.read())


@pytest.mark.skipif(
    importlib.util.find_spec("optuna_dashboard") is None,
    reason="optuna-dashboard is not installed (pip install 'autotune[dashboard]')",
)
def test_dashboard_serves_the_study_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    make_study(url)
    env = {**os.environ, "AUTOTUNE_CACHE": str(tmp_path / "cache")}
    env.pop("AUTOTUNE_STORAGE", None)
    command = Path(sys.executable).parent / "autotune"
    server = subprocess.Popen(
        [str(command), "studies", "dashboard", "--storage", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        # as from a terminal: a suite run in the background ignores SIGINT, and a child
        # started with SIGINT ignored never turns Ctrl-C into KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = first_line(server.stdout, START_S)
        assert line.startswith("optuna-dashboard of "), (line, server.poll())
        base = line.rsplit(" at ", 1)[1].strip()
        assert base.startswith("http://127.0.0.1:") and not base.endswith(":0/")
        studies = get_json(base + "api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["tiny/medusa/abc"]
        detail = get_json(f"{base}api/studies/{studies[0]['study_id']}")
        assert [t["values"] for t in detail["trials"]] == [[1.25], [1.5]]
        # open_study named the objective, and the dashboard shows that name
        assert detail["objective_names"] == ["measured speedup"]
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C: how a user stops it
        try:
            _, err = server.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            server.kill()  # never leave a server behind, whatever failed above
            _, err = server.communicate()
            err = f"not stopped by Ctrl-C within {STOP_S} s: {err}"
    assert server.returncode == 0, err
    assert "Traceback" not in err and "GET /api" not in err  # quiet: no request log


def test_dashboard_without_the_extra_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # import fails
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    optuna.create_study(study_name="s", storage=storage)
    result = CliRunner().invoke(app, ["studies", "dashboard", "--storage", storage])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'autotune[dashboard]'" in lines[0]


def test_dashboard_on_a_busy_port_is_one_line(tmp_path):
    pytest.importorskip("optuna_dashboard")
    import socket

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    optuna.create_study(study_name="s", storage=storage)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            app, ["studies", "dashboard", "--storage", storage, "--port", str(port)]
        )
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0]
