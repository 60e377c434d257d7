"""One registry: a method registered here, in the test, and nowhere else, is known to the
CLI's choices, to profile validation, to `profile`, to `bench` and to `export`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from pydantic import Field
from typer.testing import CliRunner

from autotune.cli import app
from autotune.engine.proposal import Draft, DraftContext, Drafter
from autotune.methods import registry
from autotune.methods.base import Method
from autotune.profile.blocks import MethodSettings

pytestmark = pytest.mark.usefixtures("one_thread")


class EchoSettings(MethodSettings):
    repeat: int = Field(ge=1)  # the last token, proposed this many times


class EchoDrafter(Drafter):
    def __init__(self, repeat: int):
        self.repeat = self.max_draft_tokens = repeat

    def propose(self, context: DraftContext) -> Draft:
        return Draft([context.last_token] * self.repeat)


class Echo(Method):
    name = "echo"
    title = "echo (a test method)"
    summary = "proposes the last token again"
    settings_model: ClassVar = EchoSettings
    cannot_export: ClassVar = {"vllm": "it is a method of the test suite"}

    def tune(self, ctx):
        return EchoSettings(repeat=2, search={"tuned_by": "the test"})

    def drafter(self, settings, env):
        return lambda: EchoDrafter(settings.repeat)

    def examples(self, model, folder):
        return {"twice": EchoSettings(repeat=2)}


@pytest.fixture
def echo():
    entry = registry.register(Echo())
    yield entry
    registry.unregister("echo")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def echo_profile(tmp_path: Path, model_dir: Path, repeat=2) -> Path:
    from test_profile import make_profile

    data = yaml.safe_load(yaml.safe_dump(make_profile().model_dump(mode="json", by_alias=True)))
    data["model"]["name"], data["model"]["path"] = model_dir.name, str(model_dir)
    data["methods"] = {"echo": {"repeat": repeat}}
    data["recommended"] = "echo"
    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_cli_offers_it(echo):
    from autotune.profiling.request import parse_methods

    assert parse_methods("echo,self-spec") == ("echo", "self_spec")
    assert "echo" in one_error(invoke("profile", "--methods", "nope"))
    assert any(line.startswith("echo ") for line in invoke("methods").stdout.splitlines())


def test_validate_knows_its_settings(echo, tmp_path, tiny_llama_dir):
    good = echo_profile(tmp_path, tiny_llama_dir)
    result = invoke("validate", good)
    assert result.exit_code == 0, result.stderr
    bad = echo_profile(tmp_path, tiny_llama_dir, repeat=0)
    assert "methods.echo.repeat" in invoke("validate", bad).stderr
    registry.unregister("echo")  # unknown again: its block is not a field
    assert "methods.echo" in invoke("validate", good).stderr


def test_export_names_it(echo, tmp_path, tiny_llama_dir):
    path = echo_profile(tmp_path, tiny_llama_dir)
    line = one_error(invoke("export", path, "--engine", "vllm", "--method", "echo"))
    assert "cannot serve echo" in line and "it is a method of the test suite" in line
    assert "echo" in one_error(invoke("export", path, "--engine", "vllm", "--method", "bogus"))


def test_bench_measures_it(echo, tmp_path, tiny_llama_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("Hi.", "Go on.")))
    path = echo_profile(tmp_path, tiny_llama_dir)
    result = invoke("bench", path, "--json", "--prompts", prompts, "--max-new-tokens", 6)
    assert result.exit_code == 0, (result.stderr, result.exception)
    row = json.loads(result.stdout)["echo"]
    assert row["lossless"] is True and row["prompts"] == 2


def test_profile_tunes_and_measures_it(echo, tmp_path, tiny_llama_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"Tell me about {w}."}) + "\n"
            for w in ("cats", "rain", "maps", "tea")
        )
    )
    out = tmp_path / "p.yaml"
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--methods",
        "echo",
        "--prompts",
        prompts,
        "--out",
        out,
        "--heldback-prompts",
        1,
        "--max-new-tokens",
        6,
        "--storage",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    from autotune.profile.io import read_profile

    block = read_profile(out).methods.echo
    assert block.repeat == 2 and block.search == {"tuned_by": "the test"}
    assert block.measured.lossless is True and block.measured.prompts == 1
