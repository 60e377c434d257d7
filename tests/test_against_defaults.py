"""benchmarks/against_defaults.py on a profile of the tiny random LLaMA, on the CPU: the
recommended method's setting and every published default of its family, side by side
against plain greedy on the profile's held-back prompts, and the tuned setting over the
best default with its paired interval; a family with no published default is one line."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from autotune.methods import registry
from autotune.models import fingerprint, resolve_model
from autotune.profile.blocks import HardwareInfo, ModelInfo, Workload
from autotune.profile.io import write_profile
from autotune.profile.schema import methods_block, profile_model

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 8

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def side_by_side(monkeypatch):
    """The script's module and the published defaults, imported as the script imports
    them (benchmarks/ on the path)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("against_defaults"), importlib.import_module("_defaults")


def write_tiny_profile(folder: Path, model, model_dir: Path, method: str, example: str) -> Path:
    """A profile of the tiny LLaMA recommending ``method`` with the setting of its drafter
    contract example ``example`` (heads, random, written under ``folder``), over 8
    prompts (2 held back), as ``autotune profile`` writes one."""
    prompts = folder / "prompts.jsonl"
    lines = [f"Count with me: one two three, one two three, {n} four five." for n in range(8)]
    prompts.write_text("".join(json.dumps({"prompt": line}) + "\n" for line in lines))
    settings = registry.method(method).examples(model, folder / "heads")[example]
    info = ModelInfo(
        name="tiny-llama",
        path=str(model_dir),
        fingerprint=fingerprint(resolve_model(str(model_dir))),
        architecture="LlamaForCausalLM",
        num_layers=model.config.num_hidden_layers,
        hidden_size=model.config.hidden_size,
        vocab_size=model.config.vocab_size,
        dtype="float32",
    )
    profile = profile_model()(
        model=info,
        hardware=HardwareInfo(device="cpu", device_name="x", threads=1, torch_version="2"),
        workload=Workload(prompts=str(prompts), num_prompts=8, max_new_tokens=128),
        recommended=method,
        methods=methods_block(**{method: settings}),
    )
    path = folder / "profile.yaml"
    write_profile(profile, path)
    return path


def published_names(defaults, method: str) -> set[str]:
    by_family = {
        "ngram": defaults.ngram_defaults(),
        "eagle": defaults.EAGLE_DEFAULTS,
        "medusa": defaults.medusa_defaults(num_heads=3),
    }
    return {f"default: {name}" for name in by_family[method]}


@pytest.mark.parametrize(
    ("method", "example"),
    [("ngram", "lookup_tree"), ("eagle", "draft_vocab"), ("medusa", "tree")],
)
def test_every_published_default_of_the_family_is_measured_beside_the_tuned_setting(
    side_by_side, tmp_path, tiny_llama, tiny_llama_dir, method, example
):
    script, defaults = side_by_side
    path = write_tiny_profile(tmp_path, tiny_llama, tiny_llama_dir, method, example)
    options = script.Options(
        model_path=str(tiny_llama_dir), device="cpu", limit=2, max_new_tokens=TOKENS
    )
    result = script.against_defaults(path, options)

    assert set(result["defaults"]) == published_names(defaults, method)
    assert set(result["variants"]) == {method, *result["defaults"]}
    assert result["prompts"] == 2 and result["no_default"] is None
    for name, row in result["variants"].items():
        assert row["prompts"] == 2, name
        assert row["lossless"] is True, name
    ratio = result["ratio"]
    low, high = ratio["interval"]
    assert low <= ratio["value"] <= high
    # paired over the same prompts: the ratio of the two variants' throughputs (the
    # speedups, rounded to 4 places, are too coarse to check it by at 0.1x)
    tuned = result["variants"][method]
    best = result["variants"]["default: " + ratio["best_default"]]
    expected = tuned["tokens_per_s"] / best["tokens_per_s"]
    assert ratio["value"] == pytest.approx(expected, rel=1e-3, abs=1e-4)
    assert best["speedup"] == max(result["variants"][n]["speedup"] for n in result["defaults"])


def test_a_family_without_a_published_default_is_one_line_and_decodes_nothing(
    side_by_side, tmp_path, tiny_llama, tiny_llama_dir, capsys
):
    script, _ = side_by_side
    path = write_tiny_profile(tmp_path, tiny_llama, tiny_llama_dir, "self_spec", "static")
    out = tmp_path / "result.json"
    arguments = [str(path), "--model-path", str(tiny_llama_dir), "--device", "cpu"]
    assert script.main([*arguments, "--limit", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    assert printed[0].startswith("self_spec has no published default to measure against: ")
    written = json.loads(out.read_text())
    assert (written["variants"], written["ratio"], written["prompts"]) == ({}, None, 0)
    assert written["no_default"] == printed[0]
