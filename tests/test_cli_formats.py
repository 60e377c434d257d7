"""CLI conventions: `-f/--format json|yaml|table` on the commands that print results (the
JSON and the YAML hold the same data), NO_COLOR, shell completion, --version, and a head
option for a method that --methods leaves out."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import optuna
import pytest
import yaml
from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial, TrialState
from typer.testing import CliRunner

import autotune.models
from autotune.cli import app

T0 = datetime(2026, 1, 2, 3, 4, 5)


def invoke(*args, **kwargs):
    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)


def trial(number: int, state: TrialState, value: float | None, nodes: int, **attrs):
    start = T0 + timedelta(minutes=number)
    return FrozenTrial(
        number=number,
        state=state,
        value=value,
        params={"nodes": nodes},
        distributions={"nodes": IntDistribution(1, 64)},
        user_attrs=attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=number,
        datetime_start=start,
        datetime_complete=None if state == TrialState.RUNNING else start + timedelta(seconds=9),
    )


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="tiny/medusa/abc", storage=url, direction="maximize")
    for key, value in {"model": "tiny", "method": "medusa", "objective": "speedup"}.items():
        study.set_user_attr(key, value)
    study.add_trial(trial(0, TrialState.COMPLETE, 1.25, 8, speedup=1.25))
    study.add_trial(trial(1, TrialState.COMPLETE, 1.5, 16, speedup=1.5))
    study.add_trial(trial(2, TrialState.FAIL, None, 32, fail_reason="out of memory"))
    return url


def both_formats(*args) -> dict | list:
    """The command's JSON output, checked to be the same data as its YAML output."""
    as_json = invoke(*args, "--format", "json")
    as_yaml = invoke(*args, "-f", "yaml")
    assert as_json.exit_code == as_yaml.exit_code, (as_json.stderr, as_yaml.stderr)
    data = json.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout) == data
    return data


def test_studies_list_formats(db):
    data = both_formats("studies", "list", "--storage", db)
    (study,) = data["studies"]
    assert study["study"] == "tiny/medusa/abc" and study["method"] == "medusa"
    assert study["trials"]["complete"] == 2 and study["trials"]["fail"] == 1
    assert study["best_value"] == 1.5 and study["best_trial"] == 1 and study["speedup"] == 1.5
    table = invoke("studies", "list", "--storage", db, "-f", "table")
    assert table.exit_code == 0 and "tiny/medusa/abc" in table.stdout
    assert not table.stdout.lstrip().startswith("{")


def test_studies_show_formats(db):
    data = both_formats("studies", "show", "tiny/medusa/abc", "--storage", db)
    assert data["best"]["number"] == 1 and data["best"]["params"] == {"nodes": 16}
    assert data["user_attrs"]["objective"] == "speedup" and data["profiles"] == []
    table = invoke("studies", "show", "tiny/medusa/abc", "--storage", db)
    assert "study tiny/medusa/abc" in table.stdout


def test_studies_trials_formats(db):
    data = both_formats("studies", "trials", "tiny/medusa/abc", "--storage", db)
    assert [t["number"] for t in data["trials"]] == [1, 0, 2]  # best first
    assert data["trials"][2]["fail_reason"] == "out of memory"
    # --json is kept, and is the same as --format json
    legacy = invoke("studies", "trials", "tiny/medusa/abc", "--storage", db, "--json")
    assert json.loads(legacy.stdout) == data


def test_an_unknown_format_is_a_usage_error(db):
    result = invoke("studies", "list", "--storage", db, "-f", "xml")
    assert result.exit_code == 2 and "xml" in result.stderr


def test_models_list_formats(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    rows = both_formats("models", "list")
    by_alias = {row["alias"]: row for row in rows}
    assert {"vicuna-7b", "vicuna-13b", "smollm2-135m"} <= set(by_alias)
    for row in rows:
        assert row["found"] == row["status"].startswith("found")
        assert (row["path"] is not None) == row["found"]
    assert by_alias["vicuna-13b"]["found"] is False


def a_profile_file(tmp_path):
    from test_profile import make_profile  # the hand-built profile of test_profile.py

    from autotune.profile.io import write_profile

    path = tmp_path / "profile.yaml"
    write_profile(make_profile(), path)
    return path


def test_validate_formats(tmp_path):
    path = a_profile_file(tmp_path)
    assert both_formats("validate", path) == {"profile": str(path), "valid": True, "problems": []}
    path.write_text(path.read_text().replace("max_tokens: 6", "max_tokens: 0"))
    result = invoke("validate", path, "-f", "json")
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["valid"] is False and any("max_tokens" in p for p in data["problems"])


BENCH = {
    "self_spec": {
        "speedup": 1.3,
        "speedup_interval": [1.1, 1.5],
        "prompts": 4,
        "tokens_per_step": 2.1,
        "tokens_per_s": 13.0,
        "baseline_tokens_per_s": 10.0,
        "lossless": True,
    },
    "recommended": "self_spec",
    "recommended_holds": True,
}


def test_bench_formats_its_final_output(tmp_path, monkeypatch):
    import autotune.bench

    seen = []

    def measured(*args, **kwargs):  # the measuring itself is bench's, tested elsewhere
        seen.append(args)
        return BENCH

    monkeypatch.setattr(autotune.bench, "bench_profile", measured)
    profile = tmp_path / "p.yaml"
    assert both_formats("bench", profile) == BENCH
    assert json.loads(invoke("bench", profile, "--json").stdout) == BENCH
    table = invoke("bench", profile)
    assert table.exit_code == 0
    assert (
        "self_spec:" in table.stdout and "the profile recommends self_spec: holds" in table.stdout
    )
    assert len(seen) == 4 and all(args[0] == profile for args in seen)


def test_no_color(db, tmp_path):
    """click's coloured notes (here: `studies plot` with nothing to plot) lose their colour
    under NO_COLOR; without it they keep it."""
    optuna.create_study(study_name="empty", storage=db)
    args = ["studies", "plot", "empty", "--storage", db, "--out", tmp_path / "p"]
    coloured = invoke(*args, color=True)
    assert coloured.exit_code == 0 and "note:" in coloured.stderr
    assert "\x1b[" in coloured.stderr
    plain = invoke(*args, color=True, env={"NO_COLOR": "1"})
    assert "note:" in plain.stderr and "\x1b[" not in plain.stderr


def test_shell_completion(monkeypatch):
    import typer.completion

    # typer finds the shell from this process's parents (shellingham), not from the
    # option's value: under a plain `sh` (a CI job, `bash -c` exec'ing its last command)
    # it finds `sh`, which has no completion script. The user's shell here is bash.
    monkeypatch.setattr(typer.completion, "_get_shell_name", lambda: "bash")
    assert "--install-completion" in invoke("--help").stdout
    script = invoke("--show-completion", "bash", prog_name="autotune")
    assert script.exit_code == 0 and "_AUTOTUNE_COMPLETE" in script.stdout
    words = {"_AUTOTUNE_COMPLETE": "complete_bash", "COMP_WORDS": "autotune studies da"}
    done = invoke(prog_name="autotune", env={**words, "COMP_CWORD": "2"})
    assert done.stdout.split() == ["dashboard"]


def test_version():
    from autotune import __version__

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"autotune {__version__}"


def test_a_head_option_for_a_method_left_out_is_an_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(autotune.models, "load_target", refuse)
    monkeypatch.chdir(tmp_path)
    heads = tmp_path / "heads"
    heads.mkdir()
    result = invoke(
        "profile", "--methods", "self_spec", "--heads", f"medusa={heads}", "--device", "cpu"
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "medusa" in lines[0] and "--methods leaves out" in lines[0]
    assert [p.name for p in tmp_path.iterdir()] == ["heads"]  # nothing written
