"""The command line: one-line errors for bad input (before any long work), the small
commands, and `profile` in process with its search replaced by a stub (end to end through
Ray: ``test_cli_end_to_end.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autotune.models
from autotune.cli import app
from autotune.methods import registry
from autotune.profile.io import read_profile, write_profile

PROMPT_TEXTS = [
    "Tell me a story.",
    "What is 2+2?",
    "Name a color.",
    "Write a poem about rain.",
    "Why is the sky blue?",
    "Give me a recipe.",
    "Describe a cat.",
    "How do planes fly?",
]
SMALL_SPACE = """\
skip_mask: {keep_first: 1, keep_last: 1}
calibration: {prompts: 2, tokens: 12}
trials: {prompts: 2, tokens: 8}
draft_exit: {trials: 2}
"""
HELDBACK = ["--heldback-prompts", "2", "--max-new-tokens", "12"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """An empty current folder (default profile and study-database paths land here) and
    an empty Hugging Face cache."""
    work = tmp_path / "work"
    work.mkdir()
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    return work


@pytest.fixture
def no_long_work(monkeypatch):
    """Fail the test if the tuning (the long work) starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("long work started: a method's tune was called")

    for entry in registry.methods().values():
        monkeypatch.setattr(type(entry), "tune", refuse)


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(autotune.models, "load_target", refuse)


def write_prompts(path: Path, count: int = 8) -> Path:
    path.write_text(
        "".join(
            json.dumps({"prompt": t, "id": f"p{i}"}) + "\n"
            for i, t in enumerate(PROMPT_TEXTS[:count])
        )
    )
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def assert_user_error(result, *words: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


# --- bad input -----------------------------------------------------------------------


def test_unknown_alias(workdir, no_long_work):
    result = invoke("profile", "--model", "nosuch")
    assert_user_error(result, "nosuch", "vicuna-13b")
    assert not (workdir / "profiles").exists()


def test_missing_weights(workdir, no_long_work):
    result = invoke("profile", "--model", "vicuna-13b")
    line = assert_user_error(result, "vicuna-13b", os.environ["HF_HUB_CACHE"], "--model-path")
    assert "models--lmsys--vicuna-13b-v1.3" in line
    assert not (workdir / "profiles").exists()


def test_bad_model_path(workdir, no_long_work, tmp_path):
    result = invoke("profile", "--model", "vicuna-13b", "--model-path", tmp_path / "nowhere")
    assert_user_error(result, "--model-path", "does not exist")


def test_unknown_alias_writes_nothing_at_all(workdir, no_long_work):
    result = invoke("profile", "--model", "nosuch")
    assert_user_error(result, "nosuch")
    assert files_under(workdir) == []


def test_malformed_prompts_file(workdir, tiny_llama_dir, no_long_work, no_model_load):
    bad = workdir.parent / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\nthis is not json\n')
    out = workdir / "p.yaml"
    result = invoke("profile", "--model", tiny_llama_dir, "--prompts", bad, "--out", out)
    assert_user_error(result, str(bad), "line 2")
    assert not out.exists()
    assert files_under(workdir) == []


def test_missing_prompts_file(workdir, tiny_llama_dir, no_long_work, no_model_load):
    result = invoke("profile", "--model", tiny_llama_dir, "--prompts", workdir / "none.jsonl")
    assert_user_error(result, "none.jsonl", "not found")
    assert files_under(workdir) == []


@pytest.mark.parametrize("where", ["proc", "under_a_file"])
def test_unwritable_output_path(workdir, tiny_llama_dir, no_long_work, no_model_load, where):
    if where == "proc":
        out = Path("/proc/nope/x.yaml")
    else:
        blocker = workdir.parent / "a_file"
        blocker.write_text("x")
        out = blocker / "x.yaml"
    result = invoke("profile", "--model", tiny_llama_dir, "--out", out)
    assert_user_error(result, "--out")
    assert not out.exists()
    assert files_under(workdir) == []  # checked before the study database was created


def test_bad_storage_url(workdir, tiny_llama_dir, no_long_work, no_model_load):
    out = workdir / "p.yaml"
    result = invoke("profile", "--model", tiny_llama_dir, "--storage", "notaurl", "--out", out)
    assert_user_error(result, "notaurl", "SQLAlchemy URL")
    assert files_under(workdir) == []


def test_storage_in_unusable_folder(workdir, tiny_llama_dir, no_long_work, no_model_load):
    result = invoke("profile", "--model", tiny_llama_dir, "--storage", "sqlite:////proc/nope/x.db")
    assert_user_error(result, "/proc/nope")
    assert files_under(workdir) == []


def test_postgres_storage_without_driver(workdir, tiny_llama_dir, no_long_work, no_model_load):
    result = invoke(
        "profile", "--model", tiny_llama_dir, "--storage", "postgresql://user:secret@127.0.0.1:1/db"
    )
    line = assert_user_error(result, "127.0.0.1")
    assert "secret" not in line


def test_unknown_method(workdir, no_long_work, no_model_load):
    result = invoke("profile", "--methods", "nope")
    assert_user_error(result, "nope", "self_spec, medusa, eagle")
    result = invoke("profile", "--methods", "self-spec,medusa-x")
    assert_user_error(result, "medusa-x")
    result = invoke("profile", "--methods", " , ")
    assert_user_error(result, "no method named")
    assert files_under(workdir) == []


def test_bad_search_space(workdir, tiny_llama_dir, no_long_work, no_model_load):
    space = workdir.parent / "space.yaml"
    space.write_text("skip_mask: {min_skip_ratio: 0.9, max_skip_ratio: 0.1}\n")
    result = invoke("profile", "--model", tiny_llama_dir, "--search-space", f"self_spec={space}")
    assert_user_error(result, "space.yaml", "min_skip_ratio")
    result = invoke("profile", "--model", tiny_llama_dir, "--search-space", space)
    assert_user_error(result, "METHOD=VALUE")
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--methods",
        "self_spec",
        "--search-space",
        f"eagle={space}",
    )
    assert_user_error(result, "eagle", "--methods leaves out")
    assert files_under(workdir) == []


def test_methods_command_lists_the_registry():
    result = invoke("methods")
    assert result.exit_code == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names == registry.names()


def test_search_space_command_prints_the_packaged_default():
    import yaml

    result = invoke("search-space", "medusa")
    assert result.exit_code == 0, result.stderr
    assert registry.get("medusa").space_model.model_validate(yaml.safe_load(result.stdout))
    assert_user_error(invoke("search-space", "nope"), "unknown method")


# --- small commands ------------------------------------------------------------------


def test_help():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("profile", "bench", "validate", "models"):
        assert command in result.stdout
    result = invoke("profile", "--help")
    assert result.exit_code == 0
    for option in (
        "--model",
        "--methods",
        "--out",
        "--storage",
        "--trials",
        "--time-budget",
        "--search-space",
        "--prompts",
    ):
        assert option in result.stdout


def test_help_is_fast_to_import():
    """--help must not import the heavy libraries (torch, ray, transformers)."""
    code = (
        "import sys; from autotune.cli import app; "
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'optuna') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_models_list(workdir, tiny_llama_dir):
    result = invoke("models", "list")
    assert result.exit_code == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert set(rows) >= {"vicuna-7b", "vicuna-13b", "vicuna-33b", "smollm2-135m"}
    assert rows["vicuna-13b"].rstrip().endswith("not found")
    assert "lmsys/vicuna-13b-v1.3" in rows["vicuna-13b"]
    # put the tiny model where the vicuna-13b alias looks: now it is found
    import shutil

    repo = Path(os.environ["HF_HUB_CACHE"]) / "models--lmsys--vicuna-13b-v1.3"
    shutil.copytree(tiny_llama_dir, repo / "snapshots" / "abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    result = invoke("models", "list")
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert (
        "found at" in rows["vicuna-13b"] and str(repo / "snapshots" / "abc") in rows["vicuna-13b"]
    )
    assert rows["vicuna-7b"].rstrip().endswith("not found")


def a_profile():
    from test_profile import make_profile  # the hand-built profile of test_profile.py

    return make_profile()


def test_validate_good_profile(tmp_path):
    path = tmp_path / "good.yaml"
    write_profile(a_profile(), path)
    result = invoke("validate", path)
    assert result.exit_code == 0, result.stderr
    assert "valid" in result.stdout and str(path) in result.stdout


@pytest.mark.parametrize(
    "text,word",
    [
        ("schema: autotune/profile@9\n", "autotune/profile@9"),
        ("{{{ not yaml", "not valid YAML"),
        (None, "not found"),
    ],
)
def test_validate_bad_profile(tmp_path, text, word):
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    assert_user_error(invoke("validate", path), word, str(path))


def test_validate_profile_with_wrong_field(tmp_path):
    path = tmp_path / "bad.yaml"
    write_profile(a_profile(), path)
    path.write_text(path.read_text().replace("max_tokens: 6", "max_tokens: 0"))
    assert_user_error(invoke("validate", path), "max_tokens")


def test_bench_missing_profile(tmp_path):
    assert_user_error(invoke("bench", tmp_path / "none.yaml"), "not found")


# --- profile in process, with the search replaced by a stub --------------------------


def stub_tuning(monkeypatch, seen: dict):
    """Replace the search by a fixed choice (the pipeline measures it for real on the
    held-back prompts)."""
    from autotune.drafters.self_spec import DraftExitPolicy
    from autotune.engine.skip import SkipMask
    from autotune.methods.self_spec.settings import SelfSpecSettings

    def fake(self, ctx):
        seen["ctx"] = ctx
        return SelfSpecSettings.of(
            SkipMask.of(attention=[1, 2]),
            DraftExitPolicy(3, 0.0, None),
            study=f"{ctx.workspace.target.name}/self_spec",
            search={"stub": True},
        )

    monkeypatch.setattr(type(registry.get("self_spec")), "tune", fake)


def test_profile_writes_valid_profile_with_stubbed_search(workdir, tiny_llama_dir, monkeypatch):
    seen = {}
    stub_tuning(monkeypatch, seen)
    prompts = write_prompts(workdir.parent / "prompts.jsonl")
    space = workdir.parent / "space.yaml"
    space.write_text(SMALL_SPACE)
    out = workdir / "out" / "p.yaml"
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--prompts",
        prompts,
        "--out",
        out,
        "--methods",
        "self_spec",
        "--search-space",
        f"self_spec={space}",
        "--trials",
        "3",
        "--time-budget",
        "30",
        *HELDBACK,
        "--storage",
        f"sqlite:///{workdir / 'db' / 'x.db'}",
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert f"wrote {out}" in result.stdout
    profile = read_profile(out)
    block = profile.methods.self_spec
    assert block.skip.attention == [1, 2] and block.draft.max_tokens == 3
    assert block.measured.lossless is True and block.measured.prompts == 2
    # a lone candidate is not raced (no search figures): the held-back interval alone decides
    assert block.selection is None
    clears = block.measured.speedup_interval[0] > 1.0
    assert profile.recommended == ("self_spec" if clears else "none")
    assert profile.model.num_layers == 4 and profile.model.vocab_size == 128
    assert profile.workload.num_prompts == 8 and profile.workload.max_new_tokens == 12
    assert seen["ctx"].trials == 3 and seen["ctx"].budget.seconds == 30
    assert "recommended:" in result.stdout
    assert "next: " in result.stdout  # the export commands, or what to do instead


def test_a_budget_too_small_for_the_least_run_is_refused_at_once(workdir, tiny_llama_dir):
    prompts = write_prompts(workdir.parent / "prompts.jsonl")
    out = workdir / "p.yaml"
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--prompts",
        prompts,
        "--methods",
        "ngram",
        "--budget",
        "1s",
        "--heldback-prompts",  # what 8 prompts hold back (issue 43: checked at the start)
        "2",
        "--out",
        out,
        "--storage",
        f"sqlite:///{workdir / 'x.db'}",
    )
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    last = result.stderr.strip().splitlines()[-1]  # after the progress of what it timed
    assert last.startswith("error: --budget 0:01 is too small") and "give --budget" in last
    assert "Traceback" not in result.stdout + result.stderr
    assert not out.exists()


def test_profile_default_out_goes_to_profiles_folder(workdir, tiny_llama_dir, monkeypatch):
    stub_tuning(monkeypatch, {})
    prompts = write_prompts(workdir.parent / "prompts.jsonl")
    space = workdir.parent / "space.yaml"
    space.write_text(SMALL_SPACE)
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--prompts",
        prompts,
        "--methods",
        "self_spec",
        "--search-space",
        f"self_spec={space}",
        *HELDBACK,
        "--storage",
        f"sqlite:///{workdir / 'x.db'}",
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert read_profile(workdir / "profiles" / "tiny-llama.yaml").model.name == "tiny-llama"


def test_profile_records_prompts_usable_from_elsewhere(
    workdir, tiny_llama_dir, monkeypatch, tmp_path
):
    stub_tuning(monkeypatch, {})
    write_prompts(workdir / "prompts.jsonl")
    space = workdir.parent / "space.yaml"
    space.write_text(SMALL_SPACE)
    out = workdir / "p.yaml"
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--prompts",
        "prompts.jsonl",
        "--out",
        out,
        "--methods",
        "self_spec",
        "--search-space",
        f"self_spec={space}",
        *HELDBACK,
        "--storage",
        f"sqlite:///{workdir / 'x.db'}",
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = invoke("bench", out, "--json", "--max-new-tokens", "4")
    assert result.exit_code == 0, result.stderr
