"""Models named by Hugging Face repo id, found in the local hub cache wherever the
environment puts it (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME), never downloaded; and
``find_in_hf_cache`` for anything else a repo holds (heads)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from autotune.errors import ModelNotFoundError
from autotune.models import load_target, resolve_model
from autotune.models.hub import find_in_hf_cache, hub_cache, is_repo_id, repo_folder, repo_of
from autotune.paths import cache_root

HF_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No Hugging Face variable set, and a home of the test's own."""
    for name in (*HF_VARIABLES, "AUTOTUNE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def cache_repo(hub: Path, repo_id: str, model_dir: Path, rev: str, ref: bool = True) -> Path:
    """A saved model laid out as huggingface_hub lays out a download of ``repo_id``."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / rev
    shutil.copytree(model_dir, snapshot)
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return snapshot


def test_hub_cache_follows_huggingface_hub_precedence(clean_env, tmp_path):
    assert hub_cache() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache() == tmp_path / "hf" / "hub"
    clean_env.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hub_cache() == tmp_path / "legacy"
    clean_env.setenv("HF_HUB_CACHE", "~/hub")
    assert hub_cache() == tmp_path / "home" / "hub"


def test_autotune_cache_follows_xdg(clean_env, tmp_path):
    assert cache_root() == tmp_path / "home" / ".cache" / "autotune"
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "autotune"


@pytest.mark.parametrize(
    ("text", "is_id"),
    [
        ("lmsys/vicuna-7b-v1.3", True),
        ("FasterDecoding/medusa_vicuna-7b_v1.3", True),
        ("./vicuna", False),
        ("/abs/path", False),
        ("a/b/c", False),
        ("../x", False),
        ("org/..", False),
        ("vicuna-7b", False),
    ],
)
def test_repo_ids(text, is_id):
    assert is_repo_id(text) is is_id


def test_a_repo_id_resolves_from_the_cache_under_xdg(clean_env, tmp_path, tiny_llama_dir):
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    hub = tmp_path / "xdg" / "huggingface" / "hub"
    snapshot = cache_repo(hub, "someone/Tiny-Llama", tiny_llama_dir, "abc123")
    resolved = resolve_model("someone/Tiny-Llama")
    assert (resolved.name, resolved.source, resolved.kind) == (
        "tiny-llama",
        "someone/Tiny-Llama",
        "folder",
    )
    assert resolved.path == snapshot
    target = load_target("someone/Tiny-Llama")
    assert target.name == "tiny-llama" and target.model.config.num_hidden_layers == 4


def test_a_repo_id_not_downloaded_says_how_to_fetch_it(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("lmsys/vicuna-7b-v1.3")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("lmsys/vicuna-7b-v1.3 is not downloaded")
    assert str(tmp_path / "hub" / "models--lmsys--vicuna-7b-v1.3") in message
    assert "autotune never downloads" in message
    assert "`huggingface-cli download lmsys/vicuna-7b-v1.3`" in message
    assert not (tmp_path / "hub").exists()  # nothing was created, let alone downloaded


def test_an_alias_not_downloaded_says_how_to_fetch_it(clean_env, tmp_path):
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("vicuna-13b")
    message = str(err.value)
    assert "'vicuna-13b' (lmsys/vicuna-13b-v1.3) is not downloaded" in message
    assert str(tmp_path / "hf" / "hub") in message
    assert "`huggingface-cli download lmsys/vicuna-13b-v1.3`" in message
    assert "--model-path" in message


def test_find_in_hf_cache(clean_env, tmp_path, tiny_llama_dir):
    hub = tmp_path / "hub"
    clean_env.setenv("HF_HUB_CACHE", str(hub))
    assert find_in_hf_cache("org/heads") is None
    assert find_in_hf_cache("not a repo id") is None
    main = cache_repo(hub, "org/heads", tiny_llama_dir, "main-rev")
    newer = cache_repo(hub, "org/heads", tiny_llama_dir, "other-branch", ref=False)
    os.utime(main, (1, 1))
    assert find_in_hf_cache("org/heads") == main  # refs/main wins over the newest
    (main / "config.json").unlink()  # a partial download of main: the newest complete one
    assert find_in_hf_cache("org/heads") == newer
    assert find_in_hf_cache("org/heads", needs="tokenizer.json") == main  # main has it
    assert find_in_hf_cache("org/heads", needs="medusa_lm_head.safetensors") is None
    assert repo_folder("org/heads") == hub / "models--org--heads"


def test_repo_of_a_snapshot():
    snapshot = Path("/c/hub/models--lmsys--vicuna-7b-v1.3/snapshots/0123")
    assert repo_of(snapshot) == "lmsys/vicuna-7b-v1.3"
    assert repo_of(snapshot / "sub") == "lmsys/vicuna-7b-v1.3"
    assert repo_of(Path("/models/vicuna-7b")) is None
    assert repo_of(Path("/c/hub/datasets--a--b/snapshots/1")) is None
