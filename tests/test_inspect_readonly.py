"""The study commands read the database without writing to it: a SQLite file that Optuna
itself wrote (one study, two trials) is byte-identical after `studies list`, `show`,
`trials` and `plot`, with no journal left beside it; a database of an older Optuna's
schema is one line that says how to upgrade it, and is left as it was."""

from __future__ import annotations

import hashlib
import importlib.util
import threading
import urllib.request
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app

STUDY = "plain/optuna"
SIDE_FILES = ("-journal", "-wal", "-shm")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def side_files(path: Path) -> list[Path]:
    return [p for p in (Path(f"{path}{suffix}") for suffix in SIDE_FILES) if p.exists()]


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result.stdout


@pytest.fixture
def plain_db(tmp_path, monkeypatch) -> Path:
    """One study, two trials, written by Optuna alone (rollback journal, as Optuna leaves
    it); the current folder is an empty one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    path = tmp_path / "optuna.db"
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{path}")
    study.enqueue_trial({"x": 0.25})
    study.enqueue_trial({"x": 0.75})
    study.optimize(lambda trial: (trial.suggest_float("x", 0, 1) - 0.7) ** 2, n_trials=2)
    assert not side_files(path)
    return path


@pytest.mark.parametrize(
    "command",
    [["list"], ["show", STUDY], ["trials", STUDY], ["plot", STUDY, "--out", "plots"]],
    ids=lambda c: c[0],
)
def test_inspection_leaves_the_file_byte_identical(plain_db, command):
    before = sha256(plain_db)
    invoke("studies", *command, "--storage", f"sqlite:///{plain_db}")
    assert sha256(plain_db) == before
    assert not side_files(plain_db)


def test_show_lists_every_trial(plain_db):
    out = invoke("studies", "show", STUDY, "--storage", f"sqlite:///{plain_db}")
    listing = out.split("trials, best first (2):\n", 1)[1].splitlines()
    # minimised: x=0.75 is the better of the two
    assert listing[0].startswith("  #1 COMPLETE 0.0025 in ") and listing[0].endswith(" x=0.75")
    assert listing[1].startswith("  #0 COMPLETE 0.2025 in ") and listing[1].endswith(" x=0.25")
    assert " s x=" in listing[0]  # its duration, in seconds


def test_a_database_of_an_older_optuna_says_how_to_upgrade_and_is_left_alone(plain_db):
    import sqlite3

    with sqlite3.connect(plain_db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v2.4.0.a'")
    conn.close()
    before = sha256(plain_db)
    url = f"sqlite:///{plain_db}"
    result = CliRunner().invoke(app, ["studies", "list", "--storage", url])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"`optuna storage upgrade --storage {url}`" in line and "older Optuna" in line
    assert sha256(plain_db) == before and not side_files(plain_db)


def test_an_autotune_database_in_wal_mode_is_read_without_writing_it(tmp_path, monkeypatch):
    """A file `profile` writes (write-ahead log), read while `profile` still holds it:
    the database file is unchanged (SQLite may leave the -wal/-shm files that a reader of
    such a file needs)."""
    from optuna.distributions import FloatDistribution

    from autotune.studies.tune import StudySpec, open_study

    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    path = tmp_path / "autotune.db"
    space = {"x": FloatDistribution(0, 1)}
    spec = StudySpec(name=STUDY, storage_url=f"sqlite:///{path}", space=space, metric="v", trials=1)
    study = open_study(spec)
    study.tell(study.ask(space), 1.0)
    before = sha256(path)
    for command in (["list"], ["show", STUDY], ["trials", STUDY]):
        invoke("studies", *command, "--storage", f"sqlite:///{path}")
    assert sha256(path) == before


@pytest.mark.skipif(
    importlib.util.find_spec("optuna_dashboard") is None,
    reason="optuna-dashboard is not installed (pip install 'autotune[dashboard]')",
)
def test_the_dashboard_reads_without_writing(plain_db):
    from autotune.studies.dashboard import dashboard_server
    from autotune.studies.inspect import StudyDatabase

    before = sha256(plain_db)
    server = dashboard_server(StudyDatabase(f"sqlite:///{plain_db}").storage, "127.0.0.1", 0)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}/api"
        with urllib.request.urlopen(f"{base}/studies", timeout=60) as response:
            assert STUDY.encode() in response.read()
        with urllib.request.urlopen(f"{base}/studies/1", timeout=60) as response:
            assert response.status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert sha256(plain_db) == before and not side_files(plain_db)
