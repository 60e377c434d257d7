"""The export's last line is the command that serves it: for each engine, the flags it
prints are the flags the export wrote, on the model the profile names."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from test_ngram_export import (
    CHAIN,
    flag_words,
    ngram_profile,
    speculative_config,
    with_engine_variants,
)
from typer.testing import CliRunner

from autotune.cli import app
from autotune.export import export_profile
from autotune.export.engines import VERIFIABLE
from autotune.export.serve import serve_command, serving_model
from autotune.profile.io import write_profile

OUT = Path("spec.out")


def test_vllm_is_served_with_the_config_it_wrote():
    export = export_profile(ngram_profile(CHAIN), "vllm")
    words = shlex.split(serve_command(export, "org/model", OUT) or "")
    assert words[:3] == ["vllm", "serve", "org/model"]
    assert words[3] == "--speculative-config"
    assert json.loads(words[4]) == speculative_config(export.text)


@pytest.mark.parametrize(
    "engine,start",
    [
        ("sglang", ["python", "-m", "sglang.launch_server", "--model-path", "org/model"]),
        ("llamacpp", ["llama-server", "-m", "MODEL.gguf"]),
    ],
)
def test_flag_engines_are_served_with_the_flags_they_wrote(engine, start):
    export = export_profile(ngram_profile(CHAIN), engine)
    words = shlex.split(serve_command(export, "org/model", OUT) or "")
    assert words[: len(start)] == start
    assert words[len(start) :] == flag_words(export.text)


def test_trtllm_reads_the_written_file_and_transformers_is_no_server():
    profile = ngram_profile(CHAIN)
    line = serve_command(export_profile(profile, "trtllm"), "org/model", Path("my spec.yaml"))
    assert line is not None and line.endswith("--extra_llm_api_options 'my spec.yaml'")
    assert serve_command(export_profile(profile, "hf"), "org/model", OUT) is None


def test_the_model_is_named_by_its_repo_or_alias():
    model = ngram_profile(CHAIN).model
    assert serving_model(model.model_copy(update={"repo": "org/x"})) == "org/x"
    alias = model.model_copy(update={"repo": None, "name": "smollm2-135m"})
    assert serving_model(alias) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    unknown = model.model_copy(update={"repo": None, "name": "my-own-model"})
    assert serving_model(unknown) == "MODEL"


def test_export_ends_with_the_serve_line(tmp_path):
    profile = tmp_path / "p.yaml"
    write_profile(ngram_profile(CHAIN), profile)
    out = tmp_path / "spec.yaml"
    result = CliRunner().invoke(
        app, ["export", str(profile), "--engine", "vllm", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("serve: vllm serve ")
    assert json.loads(shlex.split(last)[-1]) == speculative_config(out.read_text())


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_an_export_suggests_only_a_verify_that_runs(engine):
    # the note on an engine's own rule: `verify` where autotune runs the engine, else not
    export = export_profile(with_engine_variants(ngram_profile(CHAIN)), engine)
    suggested = f"autotune verify PROFILE --engine {engine}"
    assert (suggested in export.text) == (engine in VERIFIABLE), export.text
    if engine not in VERIFIABLE:
        assert "autotune does not run vLLM" in export.text
