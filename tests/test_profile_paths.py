"""Profiles that travel (``autotune.profile.travel``): no path of the machine that wrote
them: head folders relative to the profile or by heads-cache id (absolute again once
read), the model named by repo id, revision and fingerprint, the prompts by name and
sha256; so that a profile moved with its heads to another place (another hub cache,
another heads cache) still validates, exports and benches, and what it lacks there is one
line saying what and how. Bench's messages name what the profile holds, never a
--model-path the user did not pass."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from autotune.bench import bench_profile, find_model, workload_prompts
from autotune.errors import AutotuneError, ModelNotFoundError
from autotune.heads.medusa import save_medusa_heads
from autotune.models import fingerprint, resolve_model
from autotune.profile.blocks import ModelInfo
from autotune.profile.io import read_profile, write_profile
from autotune.profile.layout import merged
from autotune.profile.schema import methods_block, profile_model
from autotune.prompts import default_prompts_path

pytestmark = pytest.mark.usefixtures("one_thread")


def model_info(path: str | None, fp: str = "0123456789abcdef", **rest) -> ModelInfo:
    fields = {
        "name": "tiny-llama",
        "path": path,
        "fingerprint": fp,
        "architecture": "LlamaForCausalLM",
        "num_layers": 4,
        "hidden_size": 64,
        "vocab_size": 128,
        "dtype": "float32",
        **rest,
    }
    return ModelInfo(**fields)


def medusa_profile(info: ModelInfo, heads: Path):
    from autotune.methods.medusa.settings import MedusaSettings
    from autotune.profile.blocks import HardwareInfo, Workload

    medusa = MedusaSettings(heads=str(heads), num_heads=2, tree=[[0], [1], [0, 0]])
    return profile_model()(
        model=info,
        hardware=HardwareInfo(device="cpu", device_name="x", threads=1, torch_version="2"),
        workload=Workload(prompts="/old/machine/prompts.jsonl", num_prompts=4, max_new_tokens=8),
        recommended="medusa",
        methods=methods_block(medusa=medusa),
    )


def cache_repo(hub: Path, repo_id: str, model_dir: Path) -> Path:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / "rev1"
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev1")
    return snapshot


def test_head_paths_are_written_relative_and_read_back_absolute(tmp_path, monkeypatch):
    place = tmp_path / "project"
    heads = place / "heads" / "tiny-medusa"
    heads.mkdir(parents=True)
    path = place / "profiles" / "p.yaml"
    write_profile(medusa_profile(model_info("/models/tiny"), heads), path)
    assert yaml.safe_load(path.read_text())["methods"]["medusa"]["heads"] == "../heads/tiny-medusa"
    assert read_profile(path).methods.medusa.heads == str(heads)

    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(place, moved)
    shutil.rmtree(place)
    assert read_profile(moved / "profiles" / "p.yaml").methods.medusa.heads == str(
        moved / "heads" / "tiny-medusa"
    )
    # named relative to the current folder: still the heads beside the profile
    monkeypatch.chdir(moved / "heads")
    relative = Path("..") / "profiles" / "p.yaml"
    assert read_profile(relative).methods.medusa.heads == str(moved / "heads" / "tiny-medusa")


def test_heads_elsewhere_are_named_by_cache_id_or_relative_path(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "project" / "profiles" / "p.yaml"

    def written(heads: Path) -> str:
        write_profile(medusa_profile(model_info("/models/tiny"), heads), path)
        return yaml.safe_load(path.read_text())["methods"]["medusa"]["heads"]

    cached = tmp_path / "cache" / "heads" / "0123456789abcdef" / "medusa"
    assert written(cached) == "heads-cache:0123456789abcdef/medusa"
    cached.mkdir(parents=True)
    assert read_profile(path).methods.medusa.heads == str(cached)
    # far from the profile and in no cache: a relative path still, never an absolute one
    (tmp_path / "shared" / "heads" / "m").mkdir(parents=True)
    assert written(tmp_path / "shared" / "heads" / "m") == "../../shared/heads/m"
    # a folder not on this machine (an older profile's): carried as it came
    assert written(Path("/old/machine/heads/m")) == "/old/machine/heads/m"
    # beside the profile, in its own folder: relative too
    assert written(path.parent / "h") == "h"


def test_a_model_from_the_hub_cache_is_named_by_its_repo(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "rev1"
    path = tmp_path / "p.yaml"
    write_profile(medusa_profile(model_info(str(snapshot)), tmp_path), path)
    model = yaml.safe_load(path.read_text())["model"]
    assert (model["repo"], model["revision"], model["path"]) == ("org/tiny", "rev1", None)
    write_profile(medusa_profile(model_info("/models/tiny"), tmp_path), path)
    model = yaml.safe_load(path.read_text())["model"]
    assert model["repo"] is None and model["path"] is None
    # a model beside the profile: relative to it, and absolute again once read
    write_profile(medusa_profile(model_info(str(tmp_path / "models" / "tiny")), tmp_path), path)
    assert yaml.safe_load(path.read_text())["model"]["path"] == "models/tiny"
    assert read_profile(path).model.path == str(tmp_path / "models" / "tiny")


def test_the_model_path_is_optional():
    assert model_info(None).path is None


def test_find_model_goes_by_fingerprint(tmp_path, tiny_llama_dir, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshot = cache_repo(hub, "org/tiny", tiny_llama_dir)
    right = fingerprint(resolve_model(str(tiny_llama_dir)))
    assert find_model(model_info("/gone", right, repo="org/tiny")) == "org/tiny"
    # the repo's files changed since: the recorded path, which still has the profile's
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    info = model_info(str(tiny_llama_dir), right, repo="org/tiny")
    assert find_model(info) == str(tiny_llama_dir)
    # none with the fingerprint: the first found (bench then warns)
    assert find_model(model_info("/gone", "ffffffffffffffff", repo="org/tiny")) == "org/tiny"


def test_a_missing_model_names_the_profile_not_a_model_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    info = model_info("/old/machine/tiny-llama", repo="org/tiny")
    with pytest.raises(ModelNotFoundError) as err:
        find_model(info)
    message = str(err.value)
    assert "\n" not in message and "does not exist" not in message
    assert "the profile's model tiny-llama (fingerprint 0123456789abcdef)" in message
    assert "looked for tiny-llama, org/tiny, /old/machine/tiny-llama" in message
    assert "pass --model-path" in message


def test_packaged_prompts_are_found_in_this_installation(tmp_path):
    elsewhere = f"/other/machine/site-packages/autotune/data/{default_prompts_path().name}"
    assert workload_prompts(elsewhere) == str(default_prompts_path())
    own = tmp_path / "mine.jsonl"
    own.write_text("{}\n")
    assert workload_prompts(str(own)) == str(own)
    with pytest.raises(AutotuneError) as err:
        workload_prompts("mine.jsonl")
    message = str(err.value)
    assert "\n" not in message and "--prompts" in message and "beside the profile" in message


def test_prompts_are_named_by_name_and_hash(tmp_path):
    from autotune.profile.travel import file_sha256

    profile = medusa_profile(model_info("/models/tiny"), tmp_path)
    path = tmp_path / "profiles" / "p.yaml"
    packaged = default_prompts_path()
    profile.workload.prompts, profile.workload.prompts_sha256 = str(packaged), "ab"
    write_profile(profile, path)
    workload = yaml.safe_load(path.read_text())["workload"]
    assert (workload["prompts"], workload["prompts_sha256"]) == (packaged.name, "ab")
    assert read_profile(path).workload.prompts == str(packaged)
    # the user's own file: beside the profile, relative; elsewhere, by its name
    own = tmp_path / "mine.jsonl"
    own.write_text("{}\n")
    profile.workload.prompts = str(own)
    write_profile(profile, path)
    assert yaml.safe_load(path.read_text())["workload"]["prompts"] == "../mine.jsonl"
    write_profile(profile, tmp_path / "far" / "away" / "p.yaml")
    assert (
        yaml.safe_load((tmp_path / "far" / "away" / "p.yaml").read_text())["workload"]["prompts"]
        == "mine.jsonl"
    )
    assert file_sha256(own) == hashlib.sha256(b"{}\n").hexdigest()


def test_the_diagnostics_close_the_file_and_read_back(tmp_path):
    from test_profile import self_spec

    from autotune.profile.blocks import Environment

    profile = medusa_profile(model_info("/models/tiny"), tmp_path)
    profile.methods.self_spec = self_spec(0.9)
    profile.environment = Environment(noise={"busy": False, "before": [{"forward_ms": 3.0}]})
    path = tmp_path / "p.yaml"
    write_profile(profile, path)
    text = path.read_text()
    data = yaml.safe_load(text)
    assert list(data)[:4] == ["schema", "model", "recommended", "methods"]
    assert list(data)[-1] == "diagnostics" and "\n# the search's diagnostics" in text
    assert list(data["methods"]) == ["medusa"]  # the recommended one only
    diagnostics = data["diagnostics"]
    assert set(diagnostics) == {"methods", "environment"}
    assert diagnostics["methods"]["self_spec"]["skip"] == {"attention": [3, 4, 5], "mlp": [7]}
    back = read_profile(path)
    assert back.methods.self_spec == profile.methods.self_spec
    assert back.environment == profile.environment


def test_a_profile_moved_with_its_heads_still_benches(
    tmp_path, tiny_llama, tiny_llama_dir, random_heads, monkeypatch
):
    # the machine that profiled: the model in its hub cache, the heads beside the profile
    first_hub = tmp_path / "first" / "hub"
    snapshot = cache_repo(first_hub, "org/tiny", tiny_llama_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(first_hub))
    project = tmp_path / "first" / "project"
    heads = save_medusa_heads(random_heads(tiny_llama, 2), project / "heads" / "medusa", "org/tiny")
    info = model_info(str(snapshot), fingerprint(resolve_model("org/tiny")))
    write_profile(medusa_profile(info, heads), project / "profiles" / "tiny.yaml")

    # another machine: its own hub cache, the project copied to another place
    second_hub = tmp_path / "second" / "cache"
    cache_repo(second_hub, "org/tiny", tiny_llama_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(second_hub))
    moved = tmp_path / "second" / "work"
    shutil.copytree(project, moved)
    shutil.rmtree(tmp_path / "first")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Tell me a story."}\n{"prompt": "Name a color."}\n')

    results = bench_profile(moved / "profiles" / "tiny.yaml", str(prompts), 6)
    assert results["medusa"]["lossless"] is True
    assert results["medusa"]["prompts"] == 2


# --- a profile run's profile, moved to another machine ------------------------------------


def invoke(*args):
    from typer.testing import CliRunner

    from autotune.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def stub_medusa_tuning(monkeypatch):
    """The search replaced by a fixed tree on the heads the run found (the pipeline
    measures it for real on the held-back prompts)."""
    from autotune.methods import registry
    from autotune.methods.medusa.settings import MedusaSettings

    def fake(self, ctx):
        tree = [[0], [1], [0, 0]]
        return MedusaSettings(heads=str(ctx.heads), num_heads=2, tree=tree, search={"stub": 1})

    monkeypatch.setattr(type(registry.get("medusa")), "tune", fake)


def strings_in(data) -> list[str]:
    if isinstance(data, dict):
        return [s for value in data.values() for s in strings_in(value)]
    if isinstance(data, list):
        return [s for value in data for s in strings_in(value)]
    return [data] if isinstance(data, str) else []


@pytest.fixture
def profiled(tmp_path, tiny_llama, tiny_llama_dir, random_heads, monkeypatch):
    """A profile written by a tiny-model profile run: the model from a hub cache, Medusa
    heads from autotune's heads cache, the prompts beside the profile's folder."""
    from test_cli import HELDBACK, write_prompts

    hub = tmp_path / "first" / "hub"
    cache_repo(hub, "org/tiny", tiny_llama_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "first" / "cache"))
    model_fingerprint = fingerprint(resolve_model("org/tiny"))
    heads = tmp_path / "first" / "cache" / "heads" / model_fingerprint / "medusa"
    save_medusa_heads(random_heads(tiny_llama, 2), heads, "org/tiny")
    work = tmp_path / "first" / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    stub_medusa_tuning(monkeypatch)
    prompts = write_prompts(work / "prompts.jsonl")
    out = work / "profiles" / "tiny.yaml"
    result = invoke(
        "profile", "--model", "org/tiny", "--prompts", prompts, "--out", out,
        "--methods", "medusa", "--threads", "1", "--storage", f"sqlite:///{work / 'x.db'}",
        *HELDBACK,
    )  # fmt: skip
    assert result.exit_code == 0, (result.stderr, result.exception)
    return out, heads


def another_machine(tmp_path, tiny_llama_dir, monkeypatch) -> Path:
    """The first machine gone: another hub cache holding the model, an empty heads cache,
    another current folder."""
    cache_repo(tmp_path / "second" / "hub", "org/tiny", tiny_llama_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "second" / "hub"))
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "second" / "cache"))
    serving = tmp_path / "second" / "serving"
    serving.mkdir()
    monkeypatch.chdir(serving)
    return serving


def test_a_profile_run_writes_no_path_of_its_machine(profiled, tmp_path):
    out, heads = profiled
    text = out.read_text()
    for place in (tmp_path, Path.home(), Path(__file__).resolve().parents[1], heads):
        assert str(place) not in text
    absolute = [s for s in strings_in(yaml.safe_load(text)) if s.startswith("/")]
    assert absolute == []
    data = merged(yaml.safe_load(text))  # medusa recommended or not
    assert data["model"]["repo"] == "org/tiny" and data["model"]["revision"] == "rev1"
    assert data["methods"]["medusa"]["heads"] == f"heads-cache:{heads.parent.name}/medusa"
    assert data["workload"]["prompts"] == "../prompts.jsonl"
    assert len(data["workload"]["prompts_sha256"]) == 64


def test_a_profile_copied_with_its_heads_validates_exports_and_benches(
    profiled, tmp_path, tiny_llama_dir, monkeypatch
):
    out, heads = profiled
    serving = another_machine(tmp_path, tiny_llama_dir, monkeypatch)
    shutil.copy(out, serving / "tiny.yaml")
    shutil.copytree(heads, serving / "heads" / "medusa")
    shutil.copy(out.parent.parent / "prompts.jsonl", serving / "prompts.jsonl")
    shutil.rmtree(tmp_path / "first")

    profile = serving / "tiny.yaml"
    result = invoke("validate", profile)
    assert result.exit_code == 0, result.stderr
    result = invoke("export", profile, "--engine", "vllm", "--force")
    assert result.exit_code == 0, result.stderr
    assert str(serving / "heads" / "medusa") in result.stdout
    result = invoke("bench", profile, "--json", "--max-new-tokens", "4", "--threads", "1")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["medusa"]["lossless"] is True


def test_a_missing_heads_folder_is_one_line_saying_what_and_how(
    profiled, tmp_path, tiny_llama_dir, monkeypatch
):
    out, _ = profiled
    serving = another_machine(tmp_path, tiny_llama_dir, monkeypatch)
    shutil.copy(out, serving / "tiny.yaml")
    profile = serving / "tiny.yaml"
    for command in (
        ["validate", profile],
        ["export", profile, "--engine", "vllm", "--force"],
        ["bench", profile, "--max-new-tokens", "4"],
    ):
        result = invoke(*command)
        assert result.exit_code != 0, command
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (command, lines)
        assert "methods.medusa.heads" in lines[0] and "heads-cache:" in lines[0]
        assert f"copy it to {serving / 'heads' / 'medusa'}" in lines[0]
