"""Profiles that travel: head folders held relative to the profile (absolute again once
read), the model named by repo id and fingerprint, so that a profile moved with its heads
to another place (another hub cache) still benches; and bench's messages name what the
profile holds, never a --model-path the user did not pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from autotune.bench import bench_profile, find_model, workload_prompts
from autotune.errors import ModelNotFoundError
from autotune.heads.medusa import save_medusa_heads
from autotune.models import fingerprint, resolve_model
from autotune.profile.blocks import ModelInfo
from autotune.profile.io import read_profile, write_profile
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


def test_heads_far_from_the_profile_keep_their_absolute_path(tmp_path):
    heads = tmp_path / "shared" / "cache" / "heads" / "tiny-medusa"
    path = tmp_path / "project" / "profiles" / "p.yaml"
    write_profile(medusa_profile(model_info("/models/tiny"), heads), path)
    assert yaml.safe_load(path.read_text())["methods"]["medusa"]["heads"] == str(heads)
    # beside the profile, in its own folder: relative too
    write_profile(medusa_profile(model_info("/models/tiny"), path.parent / "h"), path)
    assert yaml.safe_load(path.read_text())["methods"]["medusa"]["heads"] == "h"


def test_a_model_from_the_hub_cache_is_named_by_its_repo(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "rev1"
    path = tmp_path / "p.yaml"
    write_profile(medusa_profile(model_info(str(snapshot)), tmp_path), path)
    model = yaml.safe_load(path.read_text())["model"]
    assert model["repo"] == "org/tiny" and model["path"] == str(snapshot)
    write_profile(medusa_profile(model_info("/models/tiny"), tmp_path), path)
    assert yaml.safe_load(path.read_text())["model"]["repo"] is None


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
    assert workload_prompts("/gone/mine.jsonl") == "/gone/mine.jsonl"  # load_prompts says so


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
