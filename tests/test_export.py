"""Exports of real profiles of the embedded model to six engines, and proof they are
consumed: golden files for the serving engines (vLLM, SGLang, TensorRT-LLM, llama.cpp)
checked against the field names of DESIGN.md; Draft & Verify's skip_layers.json and the
engines' tree strings parsed back to the same masks and trees (the transformers export:
``test_export_hf.py``).

Rewrite the golden files after an intended change with AUTOTUNE_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli import app
from autotune.engine.skip import SkipMask
from autotune.engine.tree import check_tree
from autotune.errors import AutotuneError
from autotune.export import ENGINES, export_profile
from autotune.export.choices import (
    format_choices,
    max_branching,
    parse_choices,
    tree_depth,
)
from autotune.methods import registry
from autotune.methods.eagle.settings import DynamicEagleTree, StaticEagleTree
from autotune.methods.self_spec.export import (
    parse_flags,
    parse_skip_layers,
)
from autotune.profile.io import read_profile, write_profile

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("AUTOTUNE_UPDATE_GOLDEN") == "1"

BRANCHING_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def fixture(name: str):
    """A profile of the embedded model: ``eagle`` and ``medusa`` are real (written by
    `autotune profile`), ``self_spec`` is hand-written (see its header)."""
    return read_profile(DATA / f"profile_smollm2-135m_{name}.yaml")


def with_eagle_tree(tree):
    profile = fixture("eagle")
    profile.methods.eagle = profile.methods.eagle.model_copy(update={"tree": tree})
    return profile


def eagle2_default():
    return with_eagle_tree(DynamicEagleTree(total_tokens=60, depth=5, top_k=10))


def branching_eagle():
    return with_eagle_tree(StaticEagleTree(choices=BRANCHING_TREE))


def branching_medusa():
    profile = fixture("medusa")
    profile.methods.medusa = profile.methods.medusa.model_copy(
        update={"tree": check_tree(BRANCHING_TREE), "num_heads": 3}
    )
    return profile


# name -> (profile maker, engine, method); the golden file is tests/golden/<name>
GOLDEN_CASES = {
    "vllm_eagle.yaml": (lambda: fixture("eagle"), "vllm", "eagle"),
    "vllm_medusa.yaml": (lambda: fixture("medusa"), "vllm", "medusa"),
    "vllm_eagle_tree.yaml": (branching_eagle, "vllm", "eagle"),
    "vllm_eagle_dynamic.yaml": (eagle2_default, "vllm", "eagle"),
    "sglang_eagle.txt": (lambda: fixture("eagle"), "sglang", "eagle"),
    "sglang_eagle_dynamic.txt": (eagle2_default, "sglang", "eagle"),
    "sglang_eagle_tree.txt": (branching_eagle, "sglang", "eagle"),
    "trtllm_eagle.yaml": (lambda: fixture("eagle"), "trtllm", "eagle"),
    "trtllm_eagle_dynamic.yaml": (eagle2_default, "trtllm", "eagle"),
    "llamacpp_self_spec.txt": (lambda: fixture("self_spec"), "llamacpp", "self_spec"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(name):
    make, engine, method = GOLDEN_CASES[name]
    result = export_profile(make(), engine, method)
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.write_text(result.text)
    assert result.text == path.read_text(), f"{name} changed; AUTOTUNE_UPDATE_GOLDEN=1 rewrites it"


def spec_config(text: str) -> dict:
    config = yaml.safe_load(text)
    assert list(config) == ["speculative_config"]
    return config["speculative_config"]


def sglang_flags(text: str) -> dict[str, str]:
    words = shlex.split(
        " ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#"))
    )
    return dict(zip(words[::2], words[1::2]))


# --- vLLM ------------------------------------------------------------------------------


def test_vllm_eagle_has_the_design_fields():
    profile = fixture("eagle")
    config = spec_config(export_profile(profile, "vllm").text)
    assert config == {
        "method": "eagle",
        "model": profile.methods.eagle.head,
        "num_speculative_tokens": tree_depth(check_tree(profile.methods.eagle.tree.choices)),
    }


def test_vllm_branching_tree_is_served_as_the_chain_of_its_depth():
    """vLLM removed tree attention and speculative_token_tree; its SpeculativeConfig
    refuses unknown keys."""
    result = export_profile(branching_eagle(), "vllm")
    config = spec_config(result.text)
    assert "speculative_token_tree" not in config
    assert config["num_speculative_tokens"] == tree_depth(BRANCHING_TREE)
    assert any("one chain per step" in w for w in result.warnings)
    # the one-line JSON for the command line says the same
    line = next(x for x in result.text.splitlines() if x.startswith("# command line:"))
    assert json.loads(line.split("'")[1]) == config


def test_vllm_dynamic_tree_takes_the_measured_static_alternative():
    profile = eagle2_default()
    result = export_profile(profile, "vllm")
    alternative = profile.methods.eagle.alternatives["static"]["tree"]["choices"]
    config = spec_config(result.text)
    assert config["num_speculative_tokens"] == tree_depth(check_tree(alternative))
    assert any("no dynamic (EAGLE-2) tree" in w for w in result.warnings)


def test_vllm_dynamic_tree_without_alternative_is_a_chain():
    profile = eagle2_default()
    profile.methods.eagle = profile.methods.eagle.model_copy(update={"alternatives": {}})
    result = export_profile(profile, "vllm")
    assert spec_config(result.text)["num_speculative_tokens"] == 6  # depth 5 -> 6 levels
    assert any("chain of 6 tokens" in w for w in result.warnings)


def test_vllm_medusa():
    profile = fixture("medusa")
    result = export_profile(profile, "vllm")
    config = spec_config(result.text)
    assert config == {
        "method": "medusa",
        "model": profile.methods.medusa.heads,
        "num_speculative_tokens": 1,
    }
    assert any("typical acceptance" in w for w in result.warnings)
    tree_result = export_profile(branching_medusa(), "vllm")
    assert spec_config(tree_result.text)["num_speculative_tokens"] == 3
    assert any("served as a chain of depth 3" in w for w in tree_result.warnings)


# --- SGLang ----------------------------------------------------------------------------


def test_sglang_flags_follow_the_design():
    profile = fixture("eagle")
    flags = sglang_flags(export_profile(profile, "sglang").text)
    assert flags == {
        "--speculative-algorithm": "EAGLE",
        "--speculative-draft-model-path": profile.methods.eagle.head,
        "--speculative-num-steps": "1",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "2",
    }


def test_sglang_dynamic_tree_maps_as_it_is():
    result = export_profile(eagle2_default(), "sglang")
    flags = sglang_flags(result.text)
    assert (
        flags["--speculative-num-steps"],
        flags["--speculative-eagle-topk"],
        flags["--speculative-num-draft-tokens"],
    ) == ("6", "10", "60")
    assert not any("static tree" in w for w in result.warnings)


def test_sglang_static_tree_is_approximated_and_said():
    result = export_profile(branching_eagle(), "sglang")
    flags = sglang_flags(result.text)
    assert flags["--speculative-num-steps"] == "3"
    assert flags["--speculative-eagle-topk"] == str(max_branching(BRANCHING_TREE)) == "2"
    assert flags["--speculative-num-draft-tokens"] == str(len(BRANCHING_TREE) + 1)
    assert any("SGLang has no static tree" in w for w in result.warnings)


# --- TensorRT-LLM ----------------------------------------------------------------------


def engine_flow_tree(text: str, flag: str):
    match = re.search(rf'{flag}="([^"]+)"', text)
    assert match, f"no {flag} in the export"
    return parse_choices(match[1])


def test_trtllm_eagle_static():
    profile = branching_eagle()
    text = export_profile(profile, "trtllm").text
    config = spec_config(text)
    assert config["decoding_type"] == "Eagle"
    assert check_tree(config["eagle_choices"]) == check_tree(BRANCHING_TREE)
    assert config["max_total_draft_tokens"] == len(BRANCHING_TREE)
    assert config["max_draft_len"] == 3
    assert engine_flow_tree(text, "--eagle_choices") == check_tree(BRANCHING_TREE)
    assert "use_dynamic_tree" not in config  # the two are mutually exclusive


def test_trtllm_eagle_dynamic():
    config = spec_config(export_profile(eagle2_default(), "trtllm").text)
    assert config["use_dynamic_tree"] is True
    assert config["dynamic_tree_max_topK"] == 10
    assert config["max_draft_len"] == 6
    assert config["max_total_draft_tokens"] == 59  # total_tokens 60, the root not counted
    assert "eagle_choices" not in config


def test_trtllm_dynamic_tree_beyond_its_bound_is_clamped_and_said():
    result = export_profile(
        with_eagle_tree(DynamicEagleTree(total_tokens=50, depth=5, top_k=7)), "trtllm"
    )
    config = spec_config(result.text)
    assert config["max_total_draft_tokens"] == 42  # 7 x 6 layers, not 49
    assert any("becomes 42" in w for w in result.warnings)


# --- trees as strings ------------------------------------------------------------------


@pytest.mark.parametrize("tree", [[[0]], BRANCHING_TREE, [[1], [0], [0, 0], [0, 0, 0], [0, 0, 1]]])
def test_tree_strings_round_trip(tree):
    canonical = check_tree(tree)
    assert parse_choices(format_choices(tree)) == canonical
    assert format_choices([[0], [0, 0], [1]]) == "[[0], [1], [0, 0]]"  # canonical order


@pytest.mark.parametrize("text", ["[[0], [0, 0", "[[0], [1, 1]]", "[[-1]]", "3", "[]"])
def test_bad_tree_strings_are_refused(text):
    with pytest.raises(ValueError):
        parse_choices(text)


# --- Draft & Verify --------------------------------------------------------------------


def test_dv_skip_layers_parse_back_to_the_mask():
    profile = fixture("self_spec")
    text = export_profile(profile, "dv").text
    skip = profile.methods.self_spec.skip
    assert parse_skip_layers(text) == SkipMask.of(skip.attention, skip.mlp)
    data = json.loads(text)
    assert data[profile.model.name] == {
        "attention": sorted(skip.attention),
        "mlp": sorted(skip.mlp),
    }
    kwargs = data["_autotune"]["generate_kwargs"]
    draft = profile.methods.self_spec.draft
    assert kwargs["max_step_draft"] == draft.max_tokens
    assert kwargs["th_stop_draft"] == draft.exit_threshold
    adaptive = with_adaptive(profile)
    kwargs = json.loads(export_profile(adaptive, "dv").text)["_autotune"]["generate_kwargs"]
    assert kwargs["auto_parameters"] == [1, 0.5, 0.9, 0.01, 0.9]  # D&V's order


def with_adaptive(profile):
    """The profile with Draft & Verify's adaptive exit rule (target 0.9, step 0.01,
    beta1 0.5, beta2 0.9)."""
    from autotune.methods.self_spec.settings import Adaptive

    spec = profile.methods.self_spec
    rule = Adaptive(target_acceptance=0.9, step=0.01, beta1=0.5, beta2=0.9)
    profile = profile.model_copy(deep=True)
    profile.methods.self_spec = spec.model_copy(
        update={"draft": spec.draft.model_copy(update={"adaptive": rule})}
    )
    return profile


def test_dv_reads_an_upstream_style_file():
    text = json.dumps(
        {
            "llama-2-13b": {"attention": [3, 5], "mlp": [6]},
            "codellama-13b": {"attention": [5], "mlp": []},
        }
    )
    assert parse_skip_layers(text, "codellama-13b") == SkipMask.of([5], [])
    with pytest.raises(ValueError, match="2 models"):
        parse_skip_layers(text)
    with pytest.raises(ValueError, match="no entry for vicuna"):
        parse_skip_layers(text, "vicuna")


# --- llama.cpp -------------------------------------------------------------------------


def test_llamacpp_flags_draft_with_a_draft_model_and_carry_length_and_exit():
    """The pinned release defaults to --spec-type none: without draft-simple the draft
    model loads and never drafts."""
    profile = fixture("self_spec")
    draft = profile.methods.self_spec.draft
    result = export_profile(profile, "llamacpp")
    assert parse_flags(result.text) == {
        "--spec-type": "draft-simple",
        "--spec-draft-n-max": str(draft.max_tokens),
        "--spec-draft-n-min": "1",
        "--spec-draft-p-min": f"{draft.exit_threshold:g}",
    }
    assert any("skip mask" in w for w in result.warnings)


# --- every exporter, every method it takes ---------------------------------------------


def all_exports():
    for name in ("eagle", "medusa", "self_spec"):
        profile = fixture(name)
        for engine in registry.get(name).exporters:
            yield engine, name, export_profile(profile, engine, name)


def test_six_engines_each_export_a_real_profile():
    done = {(engine, method) for engine, method, _ in all_exports()}
    assert {engine for engine, _ in done} == {"vllm", "sglang", "trtllm", "hf", "llamacpp", "dv"}
    assert {
        ("vllm", "eagle"),
        ("vllm", "medusa"),
        ("sglang", "eagle"),
        ("trtllm", "eagle"),
    } <= done


def test_every_export_names_its_engine_version_and_keeps_its_warnings():
    """In the file itself, or, for a JSON file the engine reads key by key, in the text
    written beside it."""
    for engine, method, result in all_exports():
        said = result.about if result.about is not None else result.text
        assert result.engine_version and result.engine_version in said, engine
        for warning in result.warnings:  # never dropped silently
            assert warning in said, (engine, method, warning)
        if result.filename.endswith(".json") and result.about is None:
            meta = json.loads(result.text)["_autotune"]
            assert meta["warnings"] == list(result.warnings)


def test_each_method_says_why_an_engine_cannot_serve_it():
    for name, method in registry.methods().items():
        assert set(method.exporters).isdisjoint(method.cannot_export), name
        assert set(method.exporters) | set(method.cannot_export) == set(ENGINES), name
        for engine, exporter in method.exporters.items():
            assert exporter.engine == engine


def test_default_method_falls_back_to_one_the_engine_serves_only_when_forced():
    profile = fixture("eagle")
    profile.methods.self_spec = fixture("self_spec").methods.self_spec
    profile.recommended = "self_spec"
    assert export_profile(profile, "dv").method == "self_spec"
    with pytest.raises(AutotuneError, match="recommends self_spec, not eagle"):
        export_profile(profile, "vllm")
    result = export_profile(profile, "vllm", force=True)
    assert result.method == "eagle"
    assert "exporting eagle instead" in result.warnings[0]


def test_export_guards_the_verdict(tmp_path):
    from autotune.profile.blocks import Verdict

    profile = fixture("eagle")
    measured = profile.methods.eagle.measured
    # not recommended: refused, with the verdict's reason, unless forced
    profile.recommended = "none"
    profile.verdict = Verdict(
        recommended="none",
        reason="eagle's interval does not clear 1.00",
        margin=0.0,
        ranking=["eagle"],
    )
    with pytest.raises(AutotuneError, match=r"recommends no method \(eagle's interval"):
        export_profile(profile, "vllm")
    assert export_profile(profile, "vllm", force=True).method == "eagle"
    # recommended but measured no faster than greedy: refused
    profile.recommended = "eagle"
    profile.methods.eagle.measured = measured.model_copy(
        update={"speedup": 1.02, "speedup_interval": [0.97, 1.08]}
    )
    with pytest.raises(AutotuneError, match="not clearly faster"):
        export_profile(profile, "vllm")
    # on the command line: one line, status 2, nothing written
    path, out = tmp_path / "p.yaml", tmp_path / "out.yaml"
    write_profile(profile, path)
    result = invoke("export", path, "--engine", "vllm", "--out", out)
    assert result.exit_code == 2 and "--force" in result.stderr and not out.exists()
    assert invoke("export", path, "--engine", "vllm", "--out", out, "--force").exit_code == 0


@pytest.mark.parametrize(
    "engine,method,words",
    [
        ("tensorrt", None, ["unknown engine 'tensorrt'", "vllm, sglang, trtllm, hf, llamacpp, dv"]),
        ("vllm", "medusa", ["no medusa settings", "it has: eagle"]),
        ("hf", None, ["transformers cannot serve eagle", "hf takes: self_spec"]),
        ("vllm", "lookahead", ["unknown method 'lookahead'", "self_spec, medusa, eagle"]),
    ],
)
def test_export_errors_list_the_choices(engine, method, words):
    with pytest.raises(AutotuneError) as err:
        export_profile(fixture("eagle"), engine, method)
    for word in words:
        assert word in str(err.value)


def test_method_names_take_dashes():
    assert export_profile(fixture("self_spec"), "dv", "self-spec").method == "self_spec"


# --- command line ----------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_export_to_stdout_with_warnings_on_stderr():
    result = invoke("export", DATA / "profile_smollm2-135m_eagle.yaml", "--engine", "vllm")
    assert result.exit_code == 0, result.stderr
    assert spec_config(result.stdout)["method"] == "eagle"
    assert result.stderr.startswith("warning: vLLM's EAGLE drafts over the whole vocabulary")


def test_cli_export_out(tmp_path):
    out = tmp_path / "sub" / "skip_layers.json"
    result = invoke(
        "export",
        DATA / "profile_smollm2-135m_self_spec.yaml",
        "--engine",
        "dv",
        "--method",
        "self_spec",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    skip = fixture("self_spec").methods.self_spec.skip
    assert parse_skip_layers(out.read_text()) == SkipMask.of(skip.attention, skip.mlp)


def test_cli_export_of_a_key_by_key_json_writes_its_notes_beside_it(tmp_path):
    out = tmp_path / "generation_config.json"
    profile = DATA / "profile_smollm2-135m_self_spec.yaml"
    result = invoke("export", profile, "--engine", "hf", "--out", out, "--force")
    assert result.exit_code == 0, result.stderr
    about = tmp_path / "generation_config.autotune.txt"
    assert f"wrote {out} and {about}" in result.stdout
    assert "_autotune" not in json.loads(out.read_text())
    assert "assistant_early_exit" in json.loads(out.read_text())
    assert "transformers" in about.read_text() and "warning:" in about.read_text()


@pytest.mark.parametrize(
    "args,words",
    [
        (["--engine", "ollama"], ["unknown engine 'ollama'", "vllm"]),
        (["--engine", "vllm", "--method", "self_spec"], ["no self_spec settings"]),
        (["--engine", "dv"], ["Draft & Verify cannot serve eagle", "dv takes: self_spec"]),
    ],
)
def test_cli_export_errors(args, words):
    result = invoke("export", DATA / "profile_smollm2-135m_eagle.yaml", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]


def test_cli_export_out_to_a_folder_writes_nothing(tmp_path):
    result = invoke(
        "export", DATA / "profile_smollm2-135m_eagle.yaml", "--engine", "sglang", "--out", tmp_path
    )
    assert result.exit_code == 2 and "folder" in result.stderr
    assert list(tmp_path.iterdir()) == []


# --- validate --------------------------------------------------------------------------


def broken_copy(tmp_path, edit) -> Path:
    data = yaml.safe_load((DATA / "profile_smollm2-135m_eagle.yaml").read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_names_each_wrong_field(tmp_path):
    def edit(data):
        data["model"]["num_layers"] = "thirty"
        del data["hardware"]["threads"]
        eagle = data["methods"]["eagle"]
        eagle["draft_vocab"] = -1
        eagle["tree"]["choices"][0] = [0, "x"]
        eagle["speed"] = "fast"

    path = broken_copy(tmp_path, edit)
    result = invoke("validate", path)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith(f"error: {path}: ") for line in lines)
    expected = {
        "model.num_layers": "got 'thirty'",
        "hardware.threads": "missing",
        "methods.eagle.draft_vocab": "expected: an integer >= 0",
        "methods.eagle.tree.choices[0][1]": "expected: an integer",
        "methods.eagle.speed": "not a field here (expected one of: head, tree",
    }
    for where, words in expected.items():
        line = next(x for x in lines if x.startswith(f"error: {path}: {where}: "))
        assert words in line, line


def test_read_profile_names_all_fields_in_one_line(tmp_path):
    def edit(data):
        data["workload"]["num_prompts"] = "many"
        data["hardware"]["threads"] = None

    path = broken_copy(tmp_path, edit)
    with pytest.raises(AutotuneError) as err:
        read_profile(path)
    message = str(err.value)
    assert "\n" not in message
    assert "workload.num_prompts" in message and "hardware.threads" in message


@pytest.mark.parametrize(
    "schema,words",
    [
        ("autotune/profile@2", ["written by a newer autotune", "upgrade", "autotune/profile@1"]),
        ("autotune/profile@0", ["not a schema this autotune knows", "autotune/profile@1"]),
        ("someone/else@1", ["not a schema this autotune knows"]),
    ],
)
def test_validate_schema_messages(tmp_path, schema, words):
    path = broken_copy(tmp_path, lambda data: data.update(schema=schema))
    result = invoke("validate", path)
    assert result.exit_code == 2
    for word in words:
        assert word in result.stderr


def test_fixtures_are_valid_and_round_trip(tmp_path):
    for name in ("eagle", "medusa", "self_spec"):
        profile = fixture(name)
        assert invoke("validate", DATA / f"profile_smollm2-135m_{name}.yaml").exit_code == 0
        write_profile(profile, tmp_path / f"{name}.yaml")
        # the model's path on the machine that profiled is not written
        model = profile.model.model_copy(update={"path": None})
        assert read_profile(tmp_path / f"{name}.yaml") == profile.model_copy(
            update={"model": model}
        )
