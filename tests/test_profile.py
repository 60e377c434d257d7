"""The profile schema, YAML round trip, recommendation and error messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from autotune.errors import AutotuneError, OutputPathError
from autotune.methods.self_spec.settings import (
    Adaptive,
    DraftSettings,
    SelfSpecSettings,
    SkipLayers,
)
from autotune.profile.blocks import HardwareInfo, Measured, ModelInfo, Workload
from autotune.profile.io import check_writable, read_profile, write_profile
from autotune.profile.schema import SCHEMA, ProfileBase, methods_block, profile_model, recommend


def measured(speedup: float) -> Measured:
    return Measured(
        speedup=speedup,
        tokens_per_step=2.5,
        acceptance_rate=0.6,
        tokens_per_s=40.0 * speedup,
        baseline_tokens_per_s=40.0,
        lossless=True,
        prompts=8,
    )


def self_spec(speedup: float = 1.3, adaptive: bool = True) -> SelfSpecSettings:
    return SelfSpecSettings(
        skip=SkipLayers(attention=[3, 4, 5], mlp=[7]),
        draft=DraftSettings(
            max_tokens=6,
            exit_threshold=0.6,
            adaptive=Adaptive(target_acceptance=0.9, step=0.01, beta1=0.5, beta2=0.9)
            if adaptive
            else None,
        ),
        measured=measured(speedup),
        study="smollm2-135m/self_spec",
        search=block_search(),
    )


def block_search() -> dict:
    return {"mask_trials": 40, "proxy_best": 1.41}


def make_profile(speedup: float = 1.3) -> ProfileBase:
    methods = methods_block(self_spec=self_spec(speedup))
    return profile_model()(
        model=ModelInfo(
            name="smollm2-135m",
            path="/models/smollm2",
            fingerprint="0123456789abcdef",
            architecture="LlamaForCausalLM",
            num_layers=30,
            hidden_size=576,
            vocab_size=49152,
            dtype="float32",
        ),
        hardware=HardwareInfo(
            device="cpu", device_name="Some CPU", threads=2, torch_version="2.5.0"
        ),
        workload=Workload(prompts="prompts.jsonl", num_prompts=80, max_new_tokens=128),
        recommended=recommend(methods),
        methods=methods,
    )


def test_round_trip(tmp_path):
    profile = make_profile()
    path = tmp_path / "sub" / "p.yaml"
    write_profile(profile, path)
    assert path.is_file()
    back = read_profile(path)
    # the model's path on this machine is not written (``profile.travel``)
    assert back == profile.model_copy(
        update={"model": profile.model.model_copy(update={"path": None})}
    )
    assert back.methods.self_spec.draft.adaptive.beta2 == 0.9
    # no temporary files left beside it
    assert [p.name for p in path.parent.iterdir()] == ["p.yaml"]


def test_yaml_layout_follows_the_design(tmp_path):
    path = tmp_path / "p.yaml"
    write_profile(make_profile(), path)
    data = yaml.safe_load(path.read_text())
    assert data["schema"] == SCHEMA == "autotune/profile@1"
    # what deploying needs first, then what it was measured on, then the diagnostics
    design = ["schema", "model", "recommended", "methods", "hardware", "workload", "diagnostics"]
    assert list(data) == design
    block = data["methods"]["self_spec"]
    assert "study" not in block and "search" not in block
    assert data["diagnostics"] == {
        "methods": {"self_spec": {"study": "smollm2-135m/self_spec", "search": block_search()}}
    }
    assert block["skip"] == {"attention": [3, 4, 5], "mlp": [7]}
    assert block["draft"]["max_tokens"] == 6
    assert set(block["measured"]) >= {
        "speedup",
        "tokens_per_step",
        "acceptance_rate",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "lossless",
        "prompts",
    }
    assert data["recommended"] == "self_spec"


def test_verdict_keeps_the_methods_not_run_and_says_why(tmp_path):
    from autotune.profiling.heldback import HeldBack
    from autotune.profiling.report import verdict_lines
    from autotune.profiling.verdict import decide

    why = "too little time to train glide heads: train them with `autotune heads train`"
    profile = make_profile()
    tuned = {"self_spec": profile.methods.self_spec}
    held = HeldBack(measured={}, looks=1, stopped="")
    profile.verdict = decide(tuned, [], held, 0.0, {"glide": why})
    path = tmp_path / "p.yaml"
    write_profile(profile, path)
    data = yaml.safe_load(path.read_text())
    assert data["diagnostics"]["verdict"]["skipped"] == {"glide": why}
    assert "skipped" not in data["verdict"] and data["verdict"]["reason"]
    assert read_profile(path).verdict.skipped == {"glide": why}
    assert f"glide skipped: {why}" in verdict_lines(profile)


def test_verdict_says_a_machine_that_became_busy_and_slower():
    from autotune.profile.blocks import Environment
    from autotune.profiling.heldback import HeldBack
    from autotune.profiling.report import verdict_lines
    from autotune.profiling.verdict import decide

    profile = make_profile()
    held = HeldBack(measured={}, looks=1, stopped="")
    profile.verdict = decide({"self_spec": profile.methods.self_spec}, [], held, 0.0, {})
    profile.verdict.time = [
        {"phase": "answers", "planned_s": 60.0, "spent_s": 58.0, "bought": "answers"},
        {"phase": "probe ngram", "planned_s": 30, "spent_s": 80, "bought": "a lead", "busy": "x"},
    ]
    profile.environment = Environment(
        noise={"busy": True, "reasons": ["x"], "forward_ms_range": [30.0, 78.0]}
    )
    lines = verdict_lines(profile)
    assert any(line.startswith("  probe ngram") and line.endswith("[busy: x]") for line in lines)
    assert not any(line.startswith("  answers") and "busy" in line for line in lines)
    assert "the machine was busy while timing: x" in lines
    assert any("speed changed 2.6x" in line for line in lines)


def test_round_trip_without_adaptive_and_method(tmp_path):
    profile = make_profile()
    profile.methods.self_spec = self_spec(adaptive=False)
    path = tmp_path / "p.yaml"
    write_profile(profile, path)
    assert read_profile(path).methods.self_spec.draft.adaptive is None
    profile.methods = methods_block()
    profile.recommended = recommend(profile.methods)
    write_profile(profile, path)  # overwrites
    back = read_profile(path)
    assert back.methods.self_spec is None and back.recommended == "none"


@pytest.mark.parametrize(
    "speedup,expected",
    [(0.5, "none"), (0.999, "none"), (1.0, "none"), (1.0001, "self_spec"), (2.4, "self_spec")],
)
def test_recommend(speedup, expected):
    assert recommend(methods_block(self_spec=self_spec(speedup))) == expected


def test_recommend_no_methods():
    assert recommend(methods_block()) == "none"


def test_schema_rejects_bad_values():
    with pytest.raises(ValueError):
        DraftSettings(max_tokens=0, exit_threshold=0.5)
    with pytest.raises(ValueError):
        DraftSettings(max_tokens=2, exit_threshold=1.5)
    with pytest.raises(ValueError):
        Measured(
            speedup=1.0,
            tokens_per_step=1.0,
            acceptance_rate=0.5,
            tokens_per_s=1.0,
            baseline_tokens_per_s=1.0,
            lossless=True,
            prompts=1,
            extra=1,
        )


# --- reading errors ------------------------------------------------------------------


def one_line_error(path: Path) -> str:
    with pytest.raises(AutotuneError) as err:
        read_profile(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_read_wrong_schema(tmp_path):
    path = tmp_path / "p.yaml"
    write_profile(make_profile(), path)
    path.write_text(path.read_text().replace(SCHEMA, "autotune/profile@2"))
    message = one_line_error(path)
    assert "autotune/profile@2" in message and SCHEMA in message


def test_read_no_schema(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("model: {name: x}\n")
    assert SCHEMA in one_line_error(path)


def test_read_garbage_yaml(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("schema: [unclosed\n  : : :\n\t- x")
    assert "not valid YAML" in one_line_error(path)


def test_read_not_a_mapping(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("- 1\n- 2\n")
    assert "mapping" in one_line_error(path)


def test_read_missing_file(tmp_path):
    message = one_line_error(tmp_path / "missing.yaml")
    assert "not found" in message and "autotune profile" in message


def test_read_invalid_field_names_the_field(tmp_path):
    path = tmp_path / "p.yaml"
    write_profile(make_profile(), path)
    data = yaml.safe_load(path.read_text())
    data["methods"]["self_spec"]["draft"]["max_tokens"] = "many"
    path.write_text(yaml.safe_dump(data))
    message = one_line_error(path)
    assert "max_tokens" in message and "invalid" in message


# --- writing errors ------------------------------------------------------------------


def test_write_under_a_file_raises_and_writes_nothing(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    target = blocker / "p.yaml"
    with pytest.raises(OutputPathError) as err:
        write_profile(make_profile(), target)
    assert "\n" not in str(err.value) and "--out" in str(err.value)
    assert not target.exists() and blocker.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_write_to_proc_raises():
    target = Path("/proc/nope/p.yaml")
    with pytest.raises(OutputPathError):
        write_profile(make_profile(), target)
    assert not target.exists()


def test_write_to_a_folder_raises(tmp_path):
    with pytest.raises(OutputPathError, match="folder"):
        write_profile(make_profile(), tmp_path)


def test_check_writable_accepts_new_nested_path_and_leaves_nothing(tmp_path):
    check_writable(tmp_path / "a" / "b" / "p.yaml")
    assert list(tmp_path.iterdir()) == []  # the folders it tried are made when written


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    """A crash between writing and renaming leaves neither the profile nor a temp file."""

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    target = tmp_path / "p.yaml"
    with pytest.raises(OutputPathError, match="disk full"):  # one line, not a traceback
        write_profile(make_profile(), target)
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_old_profile(tmp_path, monkeypatch):
    target = tmp_path / "p.yaml"
    write_profile(make_profile(1.3), target)
    before = target.read_text()
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OutputPathError):
        write_profile(make_profile(0.7), target)
    assert target.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]
    assert os.access(target, os.R_OK)


def test_cape_is_fitted_with_the_heads_trained_in_this_run(monkeypatch, tmp_path):
    # a run that trained EAGLE heads fitted CAPE with the setup's heads (none): it ended
    # with "EAGLE head folder None not found"
    from autotune.budget import Budget
    from autotune.methods import registry
    from autotune.methods.cape import fit as cape_fit
    from autotune.profiling.setup import Setup
    from autotune.profiling.tune import fit_expansions

    eagle, cape = registry.method("eagle"), registry.get("cape")
    setup = Setup([eagle], [cape], {"eagle": eagle.space(None), "cape": cape.space(None)}, {}, {})
    seen = []

    def fit(method, settings, ctx):
        seen.append(ctx.heads)
        return None

    monkeypatch.setattr(cape_fit, "fit", fit)
    tuned = {"eagle": self_spec()}  # any settings: the fit is stood in for
    fit_expansions(setup, None, tuned, Budget(10.0), [eagle], {"eagle": tmp_path})  # type: ignore[arg-type]
    assert seen == [tmp_path]
