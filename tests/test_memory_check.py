"""The memory check before loading: the arithmetic, where free memory is read from, and
a model too large for the memory left failing in one line (with its figures and what to
try) before a single weight is allocated."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import LlamaConfig
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import AutotuneError
from autotune.models import load_target, loading, memory
from autotune.models.registry import ARCHITECTURES

GIB = 1 << 30


@pytest.fixture
def free_ram(monkeypatch):
    """Pretend the machine has ``gib`` GiB of RAM available (no container limit)."""

    def pretend(gib: float) -> None:
        reading = types.SimpleNamespace(available=int(gib * GIB))
        monkeypatch.setattr("psutil.virtual_memory", lambda: reading)
        monkeypatch.setattr(memory, "CGROUP", memory.Path("/nonexistent-cgroup"))

    return pretend


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if a model is built or loaded (the check must come first): only the
    check's shapes-only build on the meta device is let through."""
    model_class = loading.AutoModelForCausalLM
    build = model_class.from_config

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    def on_meta_only(*args, **kwargs):
        if torch.get_default_device().type != "meta":
            raise AssertionError("a model was built")
        return build(*args, **kwargs)

    monkeypatch.setattr(model_class, "from_pretrained", refuse)
    monkeypatch.setattr(model_class, "from_config", on_meta_only)


def vicuna_13b() -> LlamaConfig:
    return LlamaConfig(**ARCHITECTURES["vicuna-13b"].llama_config())


def test_parameter_count_matches_the_built_model(tiny_llama):
    assert memory.parameter_count(tiny_llama.config) == sum(
        p.numel() for p in tiny_llama.parameters()
    )
    # LLaMA-13B: 40 layers of 5120, untied 32000-token embeddings
    assert memory.parameter_count(vicuna_13b()) == 13_015_864_320


def test_kv_cache_bytes(tiny_llama):
    # 4 layers x keys and values x 2 kv heads x head_dim 16 x 100 tokens x 2 bytes
    assert memory.kv_cache_bytes(tiny_llama.config, 100, "bfloat16") == 4 * 2 * 2 * 16 * 100 * 2
    # vicuna-13b has no grouped queries: 40 x 2 x 40 x 128 per token
    assert memory.kv_cache_bytes(vicuna_13b(), 1, "float32") == 40 * 2 * 40 * 128 * 4


def test_estimate_adds_weights_kv_and_margin():
    need = memory.estimate(vicuna_13b(), "float16", tokens=1000)
    assert need.weight_bytes == 13_015_864_320 * 2
    assert need.kv_bytes == 40 * 2 * 40 * 128 * 1000 * 2
    assert need.total == need.weight_bytes + need.kv_bytes + need.margin_bytes
    assert need.margin_bytes > memory.MARGIN_FIXED
    # without a token count: the run's default, within the model's context
    assert memory.estimate(vicuna_13b(), "float16").kv_tokens == 2048
    small_context = LlamaConfig(**{**vicuna_13b().to_dict(), "max_position_embeddings": 512})
    assert memory.estimate(small_context, "float16").kv_tokens == 512


def test_vicuna_13b_latency_on_a_24_gib_machine_is_one_line(free_ram, nothing_built):
    free_ram(24)
    result = CliRunner().invoke(app, ["latency", "--model", "vicuna-13b", "--random-weights"])
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stdout + result.stderr
    line = lines[0]
    assert line.startswith("error: vicuna-13b does not fit: it needs about ")
    assert "in float32 (13.02B parameters 48.5 GiB, KV cache for 176 tokens" in line
    assert "cpu has 24.0 GiB of RAM free" in line
    assert "try --dtype bfloat16 or float16 (about" in line and "a smaller model" in line


def test_bfloat16_that_fits_is_not_refused_and_one_that_does_not_is(free_ram):
    free_ram(30)  # 13B in bfloat16 needs about 27 GiB
    memory.check_fits("vicuna-13b", vicuna_13b(), "bfloat16", "cpu", tokens=176)
    free_ram(20)
    with pytest.raises(AutotuneError) as err:
        memory.check_fits("vicuna-13b", vicuna_13b(), "bfloat16", "cpu", tokens=176)
    message = str(err.value)
    assert "\n" not in message and "--dtype" not in message  # half precision already
    assert "20.0 GiB of RAM free" in message


def test_gpu_memory_is_read_from_the_gpu(monkeypatch):
    asked = []

    def mem_get_info(device):
        asked.append(device)
        return 5 * GIB, 80 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert memory.free_bytes("cuda:1") == 5 * GIB and asked == [torch.device("cuda:1")]
    with pytest.raises(AutotuneError) as err:
        memory.check_fits("vicuna-13b", vicuna_13b(), "float16", "cuda:1")
    assert "cuda:1 has 5.0 GiB of the GPU free" in str(err.value)
    assert "another GPU (--device cuda:N) or --device cpu" in str(err.value)


def test_a_container_limit_is_respected(tmp_path, monkeypatch):
    assert memory.cgroup_free(tmp_path) is None  # no cgroup v2 files: no limit known
    (tmp_path / "memory.max").write_text("max\n")
    assert memory.cgroup_free(tmp_path) is None
    (tmp_path / "memory.max").write_text(f"{8 * GIB}\n")
    (tmp_path / "memory.current").write_text(f"{5 * GIB}\n")
    (tmp_path / "memory.stat").write_text(f"anon 123\ninactive_file {GIB}\nactive_file 7\n")
    assert memory.cgroup_free(tmp_path) == 4 * GIB  # limit - used + reclaimable cache
    monkeypatch.setattr(memory, "CGROUP", tmp_path)
    monkeypatch.setattr("psutil.virtual_memory", lambda: types.SimpleNamespace(available=64 * GIB))
    assert memory.free_bytes("cpu") == 4 * GIB


def test_load_target_checks_before_loading(tiny_llama_dir, monkeypatch, nothing_built):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1 << 20)  # 1 MiB free
    with pytest.raises(AutotuneError) as err:
        load_target(str(tiny_llama_dir))
    assert str(err.value).startswith("tiny-llama does not fit: it needs about 0.5 GiB")


def test_a_model_that_fits_loads(tiny_llama_dir, free_ram):
    free_ram(2)
    assert load_target(str(tiny_llama_dir)).name == "tiny-llama"
