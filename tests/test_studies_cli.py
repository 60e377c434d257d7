"""`autotune studies` (list, show, trials, plot, delete) on a study database written here
with Optuna alone, as another machine would have written it; and `autotune latency` on a
tiny random architecture."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState
from typer.testing import CliRunner

from autotune.cli import app
from autotune.studies.storage import MeasurementCache

MEDUSA = "tiny/medusa/abc12345"
MASK = "tiny/self_spec/skip_mask"
EXIT_USED = "tiny/self_spec/draft_exit/deadbeef"  # the mask the profile kept
EXIT_OTHER = "tiny/self_spec/draft_exit/cafef00d"  # another mask's draft-exit study
KEPT_SKIP = {"attention": [1, 2], "mlp": [3]}
T0 = datetime(2026, 1, 2, 3, 4, 5)
MEDUSA_SPACE = {
    "nodes": IntDistribution(1, 64, log=True),
    "builder": CategoricalDistribution(["greedy", "sequoia"]),
}
EXIT_SPACE = {"max_tokens": IntDistribution(1, 12), "exit_threshold": FloatDistribution(0, 1)}


def trial(
    number: int,
    state: TrialState,
    value: float | None,
    params: dict,
    space: dict,
    seconds: float | None,
    **attrs,
) -> FrozenTrial:
    start = T0 + timedelta(minutes=number)
    end = None if seconds is None else start + timedelta(seconds=seconds)
    return FrozenTrial(
        number=number,
        state=state,
        value=value,
        params=params,
        distributions={k: space[k] for k in params},
        user_attrs=attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=number,
        datetime_start=start,
        datetime_complete=end,
    )


def add_study(url: str, name: str, attrs: dict, trials: list[FrozenTrial]) -> None:
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    for t in trials:
        study.add_trial(t)


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    """Four studies named as autotune names them, in a SQLite file under tmp_path; the
    current folder is an empty one (no profiles/ of its own)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    url = f"sqlite:///{tmp_path / 'other-machine.db'}"
    base = {"model": "tiny", "fingerprint": "f00dfeedf00dfeed"}
    C, F, R = TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING
    add_study(
        url,
        MEDUSA,
        {
            **base,
            "method": "medusa",
            "objective": "measured speedup",
            "heads": "/elsewhere/heads/tiny-medusa",
        },
        [
            trial(
                0,
                C,
                1.10,
                {"nodes": 4, "builder": "greedy"},
                MEDUSA_SPACE,
                30,
                speedup=1.10,
                tokens_per_s=22.0,
            ),
            trial(
                1,
                C,
                1.35,
                {"nodes": 16, "builder": "sequoia"},
                MEDUSA_SPACE,
                40,
                speedup=1.35,
                tokens_per_s=27.0,
                lossless=True,
            ),
            trial(
                2,
                F,
                None,
                {"nodes": 64, "builder": "greedy"},
                MEDUSA_SPACE,
                5,
                fail_reason="RuntimeError: out of memory",
            ),
            trial(3, C, 0.95, {"nodes": 2, "builder": "greedy"}, MEDUSA_SPACE, 20, speedup=0.95),
            trial(4, R, None, {"nodes": 8, "builder": "greedy"}, MEDUSA_SPACE, None),
        ],
    )
    add_study(
        url,
        MASK,
        {**base, "method": "self_spec", "objective": "proxy speedup"},
        [
            trial(
                0, C, 0.81, {"max_tokens": 3, "exit_threshold": 0.5}, EXIT_SPACE, 2, acceptance=0.4
            ),
            trial(
                1,
                F,
                None,
                {"max_tokens": 5, "exit_threshold": 0.5},
                EXIT_SPACE,
                1,
                fail_reason="objective was nan",
            ),
        ],
    )
    for name, skip, value in (
        (EXIT_USED, KEPT_SKIP, 1.21),
        (EXIT_OTHER, {"attention": [5], "mlp": []}, 1.05),
    ):
        add_study(
            url,
            name,
            {**base, "method": "self_spec", "skip": skip, "objective": "measured speedup"},
            [trial(0, C, value, {"max_tokens": 4}, EXIT_SPACE, 9, speedup=value)],
        )
    return url


MEASURED = {
    "speedup": 1.0573,
    "tokens_per_step": 1.18,
    "acceptance_rate": 0.19,
    "tokens_per_s": 28.3,
    "baseline_tokens_per_s": 26.7,
    "lossless": True,
    "prompts": 20,
}


def write_profile(path: Path, method: str, block: dict) -> None:
    """The parts of a profile that `studies show` reads (it does not validate)."""
    methods = {"self_spec": None, "medusa": None, "eagle": None}
    methods[method] = {**block, "measured": MEASURED, "search": {"trials": 4, "secret": 42}}
    path.write_text(
        yaml.safe_dump(
            {
                "schema": "autotune/profile@1",
                "recommended": method,
                "methods": methods,
                "model": {"name": "tiny", "fingerprint": "6bc28bb068d6989a"},
            }
        )
    )


@pytest.fixture
def profiles(tmp_path) -> Path:
    """A profiles folder: a Medusa profile that names the Medusa study, a self-spec profile
    (which names the prefix <model>/self_spec), an EAGLE profile (a study per tree kind),
    and a file that is no profile."""
    folder = tmp_path / "my-profiles"
    folder.mkdir()
    write_profile(
        folder / "tiny-medusa.yaml",
        "medusa",
        {"heads": "/h", "num_heads": 2, "tree": [[0], [0, 0]], "study": MEDUSA},
    )
    write_profile(
        folder / "tiny-self-spec.yaml", "self_spec", {"skip": KEPT_SKIP, "study": "tiny/self_spec"}
    )
    write_profile(
        folder / "tiny-eagle.yml",
        "eagle",
        {
            "tree": {"kind": "dynamic", "total_tokens": 8, "depth": 3, "top_k": 2},
            "study": {
                "static": "tiny/eagle-static/e393e1c6",
                "dynamic": "tiny/eagle-dynamic/e393e1c6",
            },
        },
    )
    (folder / "notes.yaml").write_text("- just\n- a list: [\n")
    return folder


def invoke(*args, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def ok(result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result.stdout


def user_error(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def table_rows(text: str) -> dict[str, list[str]]:
    """Rich table body rows, keyed by their first cell."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            rows[cells[0]] = cells
    return rows


# --- list ------------------------------------------------------------------------------


def test_list_shows_every_study_with_counts_best_and_last_update(db):
    rows = table_rows(ok(invoke("studies", "list", "--storage", db)))
    assert set(rows) >= {MEDUSA, MASK, EXIT_USED, EXIT_OTHER}
    # study, model, method, complete, failed, running, best, speedup, last update
    assert rows[MEDUSA] == [
        MEDUSA,
        "tiny",
        "medusa",
        "3",
        "1",
        "1",
        "1.3500",
        "1.3500",
        "2026-01-02 03:08",
    ]  # the running trial started last
    # a proxy study has a best value but no measured speedup
    assert rows[MASK][3:8] == ["1", "1", "0", "0.8100", "-"]


def test_list_reads_the_storage_from_the_environment(db, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_STORAGE", db)
    assert MEDUSA in table_rows(ok(invoke("studies", "list")))


def test_list_without_a_database_creates_none(tmp_path):
    missing = tmp_path / "nowhere" / "autotune.db"
    line = user_error(invoke("studies", "list", "--storage", f"sqlite:///{missing}"))
    assert "no study database" in line and str(missing) in line
    assert not missing.exists()


def test_list_with_a_bad_storage_url(tmp_path):
    line = user_error(invoke("studies", "list", "--storage", "not a url"))
    assert "not a SQLAlchemy URL" in line


def test_list_of_a_file_that_is_no_database(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("not SQLite\n" * 200)
    line = user_error(invoke("studies", "list", "--storage", f"sqlite:///{path}"))
    assert "cannot open the study database" in line


def test_list_of_a_database_from_an_older_optuna(db):
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v2.4.0.a'")
    line = user_error(invoke("studies", "list", "--storage", db))
    assert "optuna storage upgrade" in line


def test_list_of_an_empty_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.storages.RDBStorage(url)
    assert "no studies in" in ok(invoke("studies", "list", "--storage", url))


# --- show ------------------------------------------------------------------------------


def test_show_best_trial_attrs_and_the_profile_it_fed(db, profiles):
    out = ok(invoke("studies", "show", MEDUSA, "--storage", db, "--profiles", profiles))
    best = out.split("best trial #1: value 1.3500", 1)[1]
    assert "builder: sequoia" in best and "nodes: 16" in best
    assert "speedup: 1.35" in best and "lossless: True" in best
    assert "heads: /elsewhere/heads/tiny-medusa" in out  # a study attribute
    assert "3 complete, 1 failed, 1 running" in out
    assert f"profile: {profiles / 'tiny-medusa.yaml'} (methods.medusa; recommended medusa)" in out
    assert "speedup: 1.0573" in out  # the profile's own measured block
    assert "- [0, 0]" in out and "secret" not in out  # the tree; search left out
    assert "note: the profile's model fingerprint" in out  # the fixture's model differs
    assert "tiny-self-spec.yaml" not in out


def test_show_finds_the_self_spec_profile_by_prefix_and_mask(db, profiles):
    fed = ok(invoke("studies", "show", EXIT_USED, "--storage", db, "--profiles", profiles))
    assert f"profile: {profiles / 'tiny-self-spec.yaml'} (methods.self_spec" in fed
    mask = ok(invoke("studies", "show", MASK, "--storage", db, "--profiles", profiles))
    assert "tiny-self-spec.yaml" in mask
    other = ok(invoke("studies", "show", EXIT_OTHER, "--storage", db, "--profiles", profiles))
    assert "tiny-self-spec.yaml" not in other
    assert "profile: none in" in other


def test_show_looks_in_profiles_of_the_current_folder(db, profiles):
    assert "profile: none in profiles/" in ok(invoke("studies", "show", MEDUSA, "--storage", db))
    profiles.rename(Path.cwd() / "profiles")
    assert "tiny-medusa.yaml (methods.medusa" in ok(
        invoke("studies", "show", MEDUSA, "--storage", db)
    )


def test_unknown_study_suggests_close_names(db):
    line = user_error(invoke("studies", "show", "tiny/medusa/abc1234", "--storage", db))
    assert "no study named 'tiny/medusa/abc1234'" in line
    assert MEDUSA in line and "autotune studies list" in line
    line = user_error(invoke("studies", "trials", "tiny/self_spec", "--storage", db))
    assert MASK in line and EXIT_USED in line  # a prefix of theirs
    line = user_error(invoke("studies", "plot", "qqqqqqqq", "--storage", db))
    assert "did you mean" not in line and "autotune studies list" in line


# --- trials ----------------------------------------------------------------------------


def test_trials_json_best_first_with_fail_reason_and_duration(db):
    data = json.loads(ok(invoke("studies", "trials", MEDUSA, "--storage", db, "--json")))
    assert data["study"] == MEDUSA and data["direction"] == "maximize"
    trials = data["trials"]
    assert [t["number"] for t in trials] == [1, 0, 3, 2, 4]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 3 + ["FAIL", "RUNNING"]
    first, failed, running = trials[0], trials[3], trials[4]
    assert first["value"] == 1.35 and first["params"] == {"nodes": 16, "builder": "sequoia"}
    assert first["duration_s"] == 40.0 and first["user_attrs"]["tokens_per_s"] == 27.0
    assert failed["value"] is None and failed["fail_reason"] == "RuntimeError: out of memory"
    assert running["duration_s"] is None and running["completed"] is None


def test_trials_top(db):
    data = json.loads(
        ok(invoke("studies", "trials", MEDUSA, "--storage", db, "--json", "--top", "2"))
    )
    assert [t["number"] for t in data["trials"]] == [1, 0]
    rows = table_rows(ok(invoke("studies", "trials", MEDUSA, "--storage", db, "--top", "2")))
    assert set(rows) == {"1", "0"}
    assert rows["1"][:3] == ["1", "COMPLETE", "1.3500"] and "nodes=16" in rows["1"][3]


def test_trials_table_has_fail_reasons(db):
    rows = table_rows(ok(invoke("studies", "trials", MEDUSA, "--storage", db)))
    assert rows["2"][1] == "FAIL" and rows["2"][4] == "RuntimeError: out of memory"
    assert rows["0"][5] == "30.0"


def test_trials_table_leaves_out_parameters_the_same_in_every_row(db):
    out = ok(invoke("studies", "trials", MASK, "--storage", db))
    rows = table_rows(out)
    assert rows["0"][3] == "max_tokens=3" and rows["1"][3] == "max_tokens=5"
    assert "the same in every row: exit_threshold=0.5" in out


# --- plot ------------------------------------------------------------------------------


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_writes_history_and_importance(db, tmp_path):
    out = tmp_path / "plots"
    result = invoke("studies", "plot", MEDUSA, "--storage", db, "--out", out)
    written = [Path(line.removeprefix("wrote ")) for line in ok(result).splitlines()]
    assert sorted(p.name for p in written) == [
        "tiny__medusa__abc12345-history.png",
        "tiny__medusa__abc12345-importance.png",
    ]
    assert all(p.parent == out and is_png(p) for p in written)


def test_plot_without_enough_trials_for_importance(db, tmp_path):
    out = tmp_path / "plots"
    result = invoke("studies", "plot", EXIT_USED, "--storage", db, "--out", out)
    assert "parameter importance not drawn" in result.stderr
    assert [p.name for p in out.iterdir()] == ["tiny__self_spec__draft_exit__deadbeef-history.png"]
    assert is_png(next(out.iterdir()))


# --- delete ----------------------------------------------------------------------------


def study_names(url: str) -> set[str]:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT study_name FROM studies")}


def test_delete_with_yes_deletes_that_study_only(db):
    cache = MeasurementCache(db)
    cache.put("latency", "f00dfeedf00dfeed", "cpu", "verify", [1.0, 1.1])
    result = ok(invoke("studies", "delete", MEDUSA, "--storage", db, "--yes"))
    assert f"deleted study {MEDUSA} (5 trials)" in result
    assert study_names(db) == {MASK, EXIT_USED, EXIT_OTHER}
    assert cache.get("latency", "f00dfeedf00dfeed", "cpu", "verify") == [1.0, 1.1]
    assert MEDUSA not in ok(invoke("studies", "list", "--storage", db))


@pytest.mark.parametrize("answer", ["n\n", "", None])
def test_delete_refused_without_confirmation(db, answer):
    result = invoke("studies", "delete", MEDUSA, "--storage", db, input=answer)
    assert result.exit_code == 1
    assert "delete study tiny/medusa/abc12345 and its 5 trials" in result.stdout
    assert MEDUSA in study_names(db)


def test_delete_confirmed(db):
    ok(invoke("studies", "delete", MASK, "--storage", db, input="y\n"))
    assert MASK not in study_names(db)


def test_delete_unknown_study(db):
    user_error(invoke("studies", "delete", "tiny/medusa", "--storage", db, "--yes"))
    assert len(study_names(db)) == 4


# --- latency ---------------------------------------------------------------------------


@pytest.mark.usefixtures("one_thread")
def test_latency_random_weights_json(tiny_alias):
    data = json.loads(
        ok(
            invoke(
                "latency", "--model", tiny_alias, "--random-weights", "--max-tokens", "3", "--json"
            )
        )
    )
    assert data["random_weights"] is True and data["model"] == tiny_alias
    assert (data["num_layers"], data["hidden_size"], data["dtype"]) == (2, 64, "float32")
    assert len(data["seconds"]) == 3 and all(s > 0 for s in data["seconds"])
    assert data["relative"][0] == 1.0 and len(data["relative"]) == 3
    assert data["hardware"]["device"] == "cpu" and data["context_tokens"] > 0


@pytest.mark.usefixtures("one_thread")
def test_latency_random_weights_table_and_folder_config(tiny_alias, tiny_llama_dir, tmp_path):
    out = ok(
        invoke(
            "latency",
            "--model",
            tiny_alias,
            "--random-weights",
            "--max-tokens",
            "2",
            "--dtype",
            "bfloat16",
        )
    )
    assert "random_weights: true" in out and "bfloat16" in out
    assert set(table_rows(out)) >= {"1", "2"} and "3" not in table_rows(out)
    # a folder with config.json alone: no weights, no tokenizer
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    data = json.loads(
        ok(invoke("latency", "--model", folder, "--random-weights", "--max-tokens", "1", "--json"))
    )
    assert data["num_layers"] == 4 and data["random_weights"] is True


@pytest.mark.usefixtures("one_thread")
def test_latency_on_real_weights_says_so(tiny_llama_dir):
    data = json.loads(
        ok(invoke("latency", "--model", tiny_llama_dir, "--max-tokens", "2", "--json"))
    )
    assert data["random_weights"] is False and data["num_layers"] == 4


def test_latency_random_weights_of_an_unknown_architecture(tmp_path):
    line = user_error(invoke("latency", "--model", "nosuch", "--random-weights"))
    assert "nosuch" in line and "vicuna-7b" in line


def test_latency_on_cuda_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = user_error(
        invoke("latency", "--model", "vicuna-7b", "--random-weights", "--device", "cuda")
    )
    assert "--device cuda" in line and "no CUDA GPU" in line


@pytest.mark.parametrize(
    "alias, billions",
    [("vicuna-7b", 6.74), ("vicuna-13b", 13.02), ("vicuna-33b", 32.53), ("smollm2-135m", 0.135)],
)
def test_registered_shapes_give_the_published_sizes(alias, billions):
    """Counted on the meta device: shapes only, no memory."""
    from transformers import LlamaConfig

    from autotune.models.memory import parameter_count
    from autotune.models.registry import ARCHITECTURES

    count = parameter_count(LlamaConfig(**ARCHITECTURES[alias].llama_config()))
    assert count == pytest.approx(billions * 1e9, rel=0.01)


def test_profiles_naming_reads_eagle_study_dicts(profiles):
    """An EAGLE profile names one study per tree kind."""
    from autotune.studies.inspect import StudySummary, profiles_naming

    def found(name: str) -> list[tuple[str, str]]:
        summary = StudySummary(name, {}, "maximize", [])
        return [(use.path.name, use.method) for use in profiles_naming(summary, profiles)]

    for kind in ("static", "dynamic"):
        assert found(f"tiny/eagle-{kind}/e393e1c6") == [("tiny-eagle.yml", "eagle")]
    assert found("tiny/eagle-static/00000000") == []
    assert found("tiny/eagle") == []


def test_profiles_naming_reads_the_study_from_a_profiles_diagnostics(tmp_path):
    """A profile written today keeps a method's study name in its closing diagnostics
    section, beside the deployable block: the study is still found to have fed it."""
    import yaml

    from autotune.studies.inspect import StudySummary, profiles_naming

    profile = {
        "schema": "autotune/profile@1",
        "model": {"name": "tiny"},
        "recommended": "ngram",
        "methods": {"ngram": {"measured": {"speedup": 1.2}}},
        "diagnostics": {"methods": {"ngram": {"study": "tiny/ngram"}}},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(profile))
    summary = StudySummary("tiny/ngram", {}, "maximize", [])
    uses = [(use.path.name, use.method) for use in profiles_naming(summary, tmp_path)]
    assert uses == [("tiny.yaml", "ngram")]
