"""Will the model fit? Checked before loading, from the config alone: a model too large for
the memory left is one line saying so, not a process killed by the kernel halfway
through loading."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError

GIB = 1 << 30
BYTES_PER_PARAMETER = {"float32": 4, "bfloat16": 2, "float16": 2}
# The KV cache is sized for this many tokens when the caller does not say: a prompt, its
# answer and a draft tree, with room to spare (capped by the model's own context).
RUN_TOKENS = 2048
# What a loaded model needs beyond its weights and KV cache (activations, logits, torch's
# allocator and runtime, the tokenizer): a share of the total plus a fixed amount.
MARGIN_SHARE = 0.10
MARGIN_FIXED = GIB // 2
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemoryNeed:
    parameters: int
    dtype: str
    weight_bytes: int
    kv_tokens: int
    kv_bytes: int
    margin_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.margin_bytes


def parameter_count(config: Any) -> int:
    """Parameters of the model ``config`` describes, counted on a model built on torch's
    meta device: shapes only, no storage, any architecture transformers knows (tied
    embeddings are counted once, as they are held once)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config: Any, tokens: int, dtype: str) -> int:
    """Keys and values of every layer for ``tokens`` tokens (grouped-query heads counted
    as the model has them)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = config.num_hidden_layers * 2 * kv_heads * head_dim
    return per_token * tokens * BYTES_PER_PARAMETER[dtype]


def estimate(
    config: Any, dtype: str, tokens: int | None = None, parameters: int | None = None
) -> MemoryNeed:
    """What loading the model in ``dtype`` and running it over ``tokens`` tokens needs."""
    if tokens is None:
        tokens = min(RUN_TOKENS, getattr(config, "max_position_embeddings", None) or RUN_TOKENS)
    count = parameter_count(config) if parameters is None else parameters
    weights = count * BYTES_PER_PARAMETER[dtype]
    kv = kv_cache_bytes(config, tokens, dtype)
    margin = int(MARGIN_SHARE * (weights + kv)) + MARGIN_FIXED
    return MemoryNeed(count, dtype, weights, tokens, kv, margin)


def free_bytes(device: str) -> int:
    """Memory free for a new model on ``device``: the GPU's free memory, or the RAM the
    system can give without swapping (within the container's limit, if it has one)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    import psutil

    available = int(psutil.virtual_memory().available)
    limit = cgroup_free(CGROUP)
    return available if limit is None else min(available, limit)


def cgroup_free(root: Path) -> int | None:
    """What a cgroup v2 memory limit still allows (None: no limit, or no cgroup v2): in a
    container, /proc/meminfo (and so psutil) shows the host's memory, not the limit."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((root / "memory.current").read_text())
        stat = dict(line.split() for line in (root / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return None
    # the page cache counts as used, but its inactive part is given back on demand
    return max(0, int(limit) - used + int(stat.get("inactive_file", 0)))


def check_fits(name: str, config: Any, dtype: str, device: str, tokens: int | None = None) -> None:
    """Fail (one line: the figures, and what to try) when ``name`` would not fit in the
    memory free on ``device``."""
    need = estimate(config, dtype, tokens)
    free = free_bytes(device)
    if need.total <= free:
        return
    where = "the GPU" if device.startswith("cuda") else "RAM"
    raise AutotuneError(
        f"{name} does not fit: it needs about {gib(need.total)} in {dtype} "
        f"({need.parameters / 1e9:.2f}B parameters {gib(need.weight_bytes)}, KV cache for "
        f"{need.kv_tokens} tokens {gib(need.kv_bytes)}, margin {gib(need.margin_bytes)}) "
        f"and {device} has {gib(free)} of {where} free; try "
        + ", ".join(_alternatives(config, need, device, tokens))
    )


def _alternatives(config: Any, need: MemoryNeed, device: str, tokens: int | None) -> list[str]:
    tries = []
    if need.dtype == "float32":
        half = estimate(config, "bfloat16", tokens, parameters=need.parameters)
        tries.append(f"--dtype bfloat16 or float16 (about {gib(half.total)})")
    machine = "or a machine with more memory"
    if device.startswith("cuda"):
        tries.append("another GPU (--device cuda:N) or --device cpu")
    else:
        from autotune.hardware import cuda_count

        if cuda_count():
            tries.append("a GPU (--device cuda)")
        else:
            machine += " or a GPU"
    return [*tries, "a smaller model", machine]


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
