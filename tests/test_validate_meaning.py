"""`autotune validate` checks meaning as well as shape (autotune.profile.meaning and each
method's ``problems``): layer indices within the model, trees within the heads and the
vocabulary, the recommended method present, positive sizes; read from the profile's own
model block, so no model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli import app
from autotune.methods import registry
from autotune.profile.blocks import ModelInfo
from autotune.profile.io import read_profile, write_profile
from autotune.profile.meaning import profile_problems
from autotune.profile.schema import methods_block


def write_edited(tmp_path: Path, edit) -> Path:
    """The hand-built profile of test_profile.py, written as YAML after ``edit(data)``."""
    from test_profile import make_profile

    path = tmp_path / "profile.yaml"
    write_profile(make_profile(), path)
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def validate(path: Path) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert "Traceback" not in result.stdout + result.stderr
    errors = result.stderr.strip().splitlines()
    assert all(line.startswith(f"error: {path}: ") for line in errors), errors
    return result.exit_code, [line.removeprefix(f"error: {path}: ") for line in errors]


def test_a_sound_profile_is_valid(tmp_path):
    path = write_edited(tmp_path, lambda data: None)
    assert validate(path) == (0, [])
    assert profile_problems(read_profile(path)) == []


def test_layer_indices_outside_the_model(tmp_path):
    def skip_layer_400(data):
        data["methods"]["self_spec"]["skip"]["attention"].append(400)

    status, problems = validate(write_edited(tmp_path, skip_layer_400))
    assert status == 2
    assert problems == [
        "methods.self_spec.skip.attention: layers [400] are outside the model's 30 layers (0..29)"
    ]


def test_a_recommended_method_the_profile_does_not_hold(tmp_path):
    def recommend_eagle(data):
        data["recommended"] = "eagle"

    status, problems = validate(write_edited(tmp_path, recommend_eagle))
    assert status == 2 and len(problems) == 1
    assert problems[0].startswith("recommended: got 'eagle'") and "self_spec, none" in problems[0]


def test_sizes_that_are_not_positive(tmp_path):
    def negative(data):
        data["model"]["num_layers"] = -30
        data["workload"]["max_new_tokens"] = 0
        data["methods"]["self_spec"]["measured"]["tokens_per_s"] = -3.5
        data["methods"]["self_spec"]["measured"]["acceptance_rate"] = 1.5

    status, problems = validate(write_edited(tmp_path, negative))
    assert status == 2
    wrong = {p.split(":")[0] for p in problems}
    assert {
        "model.num_layers",
        "workload.max_new_tokens",
        "methods.self_spec.measured.tokens_per_s",
        "methods.self_spec.measured.acceptance_rate",
    } <= wrong


def test_shape_errors_come_first_one_line_each(tmp_path):
    def bad_shape(data):
        data["methods"]["self_spec"]["draft"]["max_tokens"] = 0
        data["model"]["hidden_size"] = "wide"

    status, problems = validate(write_edited(tmp_path, bad_shape))
    assert status == 2 and len(problems) == 2
    assert any(p.startswith("methods.self_spec.draft.max_tokens") for p in problems)
    assert any(p.startswith("model.hidden_size") for p in problems)


def test_medusa_tree_deeper_than_its_heads(tmp_path):
    def medusa(data):
        block = {"heads": "heads/m", "num_heads": 2, "tree": [[0], [0, 0], [0, 0, 0]]}
        data["methods"]["medusa"] = block

    status, problems = validate(write_edited(tmp_path, medusa))
    assert status == 2 and len(problems) == 1
    assert problems[0].startswith("methods.medusa") and "num_heads 2" in problems[0]


# --- each method's own checks, on settings built in Python -------------------------------


def model_block(vocab_size: int = 100, num_layers: int = 4) -> ModelInfo:
    return ModelInfo(
        name="tiny",
        path="tiny",
        fingerprint="f",
        architecture="LlamaForCausalLM",
        num_layers=num_layers,
        hidden_size=16,
        vocab_size=vocab_size,
        dtype="float32",
    )


def problems_of(name: str, settings, model: ModelInfo) -> list[str]:
    return registry.method(name).problems(settings, model)


def test_medusa_ranks_within_the_vocabulary():
    from autotune.methods.medusa.settings import MedusaSettings

    settings = MedusaSettings(heads="h", num_heads=2, tree=[[0], [7], [7, 3]])
    assert problems_of("medusa", settings, model_block(vocab_size=8)) == []
    (problem,) = problems_of("medusa", settings, model_block(vocab_size=7))
    assert problem.startswith("tree: rank 7") and "7 tokens" in problem


def test_eagle_trees_within_the_draft_vocabulary():
    from autotune.methods.eagle.settings import DynamicEagleTree, EagleSettings, StaticEagleTree

    static = StaticEagleTree(choices=[[0], [5], [5, 0]])
    dynamic = DynamicEagleTree(total_tokens=16, depth=3, top_k=6)
    model = model_block(vocab_size=100)
    assert problems_of("eagle", EagleSettings(head="h", tree=static), model) == []
    assert problems_of("eagle", EagleSettings(head="h", tree=dynamic), model) == []
    small = EagleSettings(head="h", tree=static, draft_vocab=5)
    assert problems_of("eagle", small, model)[0].startswith("tree.choices: rank 5")
    narrow = EagleSettings(head="h", tree=dynamic, draft_vocab=4)
    assert problems_of("eagle", narrow, model)[0].startswith("tree.top_k: 6 exceeds")
    wide = EagleSettings(head="h", tree=static, draft_vocab=101)
    assert problems_of("eagle", wide, model)[0].startswith("draft_vocab: 101")


def test_method_problems_are_prefixed_with_their_block():
    from test_profile import make_profile

    from autotune.methods.medusa.settings import MedusaSettings

    profile = make_profile()
    profile.model = model_block(vocab_size=3, num_layers=30)
    self_spec = profile.methods.self_spec
    medusa = MedusaSettings(heads="h", num_heads=1, tree=[[0], [4]])
    profile.methods = methods_block(self_spec=self_spec, medusa=medusa)
    assert [p for p in profile_problems(profile) if p.startswith("methods.")] == [
        "methods.medusa.tree: rank 4 needs a top-5 token, but the model's vocabulary has 3 tokens"
    ]


@pytest.mark.parametrize("name", list(registry.methods()))
def test_every_methods_examples_have_no_problems(name, tiny_llama, tmp_path):
    """What the drafter contract suite drafts with must pass the meaning checks."""
    config = tiny_llama.config
    model = model_block(config.vocab_size, config.num_hidden_layers)
    for example, settings in registry.method(name).examples(tiny_llama, tmp_path).items():
        assert problems_of(name, settings, model) == [], example
