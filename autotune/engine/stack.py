"""The runner's decoder layers in the engine's C++ code (``decoder.cpp``), where they apply.

They apply to a LLaMA-family block (LLaMA, Vicuna, Mistral, Qwen2: RMSNorm, rotary
q/k/v with an optional bias, grouped-query attention, SiLU-gated MLP) in float32 on the
CPU, with the engine's own products. There one call runs every layer of a forward: on 2
cores the ~35 torch operations a layer makes in Python took 7.5 ms of a 16.4 ms
SmolLM2-135M one-token forward. Elsewhere (GPUs, half precision, other blocks, no C++
compiler) the runner keeps its Python layers (``engine.layers``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from autotune.engine import kernels, layers, native
from autotune.engine.layers import Fused, Product
from autotune.engine.segment import LayerRows

_KERNEL_CODES = {kernels.LINEAR: 0, kernels.TRANSPOSED: 1, kernels.SMALL: 2}
CAUSAL, NEW_TOKENS, WHOLE = 0, 1, 2  # how ``decoder.cpp`` reads the mask
_NO_MASK = torch.empty(0, dtype=torch.uint8)


class StackedModel(Protocol):
    """What the C++ layers read of a runner (``engine.runner.Runner``): the model, its
    decoder layers and their fused products, where and how it computes."""

    model: Any
    config: Any
    layers: list[Any]
    fused: list[tuple[Fused, Fused]]
    lm_head: Any
    num_layers: int
    device: torch.device
    dtype: torch.dtype
    product: Product


def unsupported(runner: StackedModel) -> str | None:
    """Why the C++ layers cannot run this runner's model, or None when they can."""
    config = runner.config
    if runner.device.type != "cpu" or runner.dtype != torch.float32:
        return "float32 on the CPU only"
    if runner.product is not layers.linear:
        return "another product was asked for"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r}, not silu"
    head_dim = runner.layers[0].self_attn.head_dim
    if head_dim % 16 or head_dim > 128:
        return f"head_dim {head_dim}: a multiple of 16 up to 128 only"
    for layer in runner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(getattr(norm, "variance_epsilon", None) is None for norm in norms):
            return f"norm {type(norms[0]).__name__}, not LLaMA's RMSNorm"
        if attention.o_proj.bias is not None or any(
            getattr(mlp, name).bias is not None for name in ("gate_proj", "up_proj", "down_proj")
        ):
            return "biases outside q/k/v"
    if not native.available():
        return "the engine's C++ code could not be built here"
    return None


def move_to_huge_pages(runner: StackedModel) -> None:
    """Copy the weights every forward streams into memory of 2 MiB pages, once per model,
    and point the modules at the copies (the same values): TLB misses of 4 KiB pages made
    products over 8 rows 1.4x slower on 2 cores (``huge_pages.cpp``). Skipped where the
    copy would crowd memory: it is faster, not needed."""
    model = runner.model
    if getattr(model, "_autotune_huge_pages", False):
        return
    import psutil

    fused = [f for pair in runner.fused for f in pair]
    linears = [m for layer in runner.layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]
    linears.append(runner.lm_head)  # tied to the embedding in many models: one Parameter
    weights = [f.weight for f in fused] + [m.weight.detach() for m in linears]
    needed = sum(w.numel() * w.element_size() for w in weights)
    if psutil.virtual_memory().available < 2 * needed:
        return
    copies = native.huge_page_copies([w.contiguous() for w in weights])
    for f, copy in zip(fused, copies):
        f.move(copy)
    for module, copy in zip(linears, copies[len(fused) :]):
        module.weight.data = copy
    object.__setattr__(model, "_autotune_huge_pages", True)


class NativeStack:
    """Every decoder layer of a forward in one C++ call."""

    def __init__(self, runner: StackedModel):
        move_to_huge_pages(runner)
        weights: list[torch.Tensor] = []
        for layer, (qkv, gate_up) in zip(runner.layers, runner.fused):
            bias = qkv.bias if qkv.bias is not None else torch.empty(0)
            weights += [
                layer.input_layernorm.weight.detach(),
                qkv.weight,
                bias.detach(),
                layer.self_attn.o_proj.weight.detach(),
                layer.post_attention_layernorm.weight.detach(),
                gate_up.weight,
                layer.mlp.down_proj.weight.detach(),
            ]
        first = runner.layers[0]
        self.num_layers = runner.num_layers
        self.head_dim = first.self_attn.head_dim
        config = runner.config
        self.scale = float(getattr(first.self_attn, "scaling", self.head_dim**-0.5))
        # the weights each kind of product takes (every layer's have the same shapes)
        self._roles = (
            runner.fused[0][0].weight,
            first.self_attn.o_proj.weight,
            runner.fused[0][1].weight,
            first.mlp.down_proj.weight,
        )
        self._stack = native.decoder_stack(
            [w.contiguous() for w in weights],
            config.num_attention_heads,
            config.num_key_value_heads,
            self.head_dim,
            float(first.input_layernorm.variance_epsilon),
        )

    @classmethod
    def of(cls, runner: StackedModel) -> NativeStack | None:
        return None if unsupported(runner) else cls(runner)

    def run(self, hidden: torch.Tensor, rows: LayerRows) -> None:
        """Every layer over ``hidden`` [S, H] (updated in place), the segments' rows one
        after another, as ``Runner.forward_batch`` describes."""
        rope, segments, counts, skip = rows.rope, rows.segments, rows.counts, rows.skip
        attends = [i not in skip.attention for i in range(self.num_layers)]
        prefixes, masks, modes = [], [], []
        for segment, seq in zip(segments, counts):
            cache = segment.cache
            starts = [cache.length(i) for i in range(self.num_layers)]
            mode, mask_rows = self._mask(
                segment.mask, seq, {p for p, a in zip(starts, attends) if a}
            )
            for layer, prefix in enumerate(starts):
                if attends[layer]:
                    cache.reserve(layer, prefix + seq)
            prefixes.append(starts)
            masks.append(mask_rows)
            modes.append(mode)
        self._stack.forward(
            hidden,
            rope[0][0],
            rope[1][0],
            counts,
            [segment.cache.keys for segment in segments],
            [segment.cache.values for segment in segments],
            prefixes,
            masks,
            modes,
            [not a for a in attends],
            [i in skip.mlp for i in range(self.num_layers)],
            self._kernels(hidden.shape[0]),
            self.scale,
        )
        for segment, starts, seq in zip(segments, prefixes, counts):
            for layer, prefix in enumerate(starts):
                if attends[layer]:
                    segment.cache.lengths[layer] = prefix + seq

    def _kernels(self, rows: int) -> list[int]:
        """(kernel, padded columns) for each kind of product, as ``layers.linear`` picks."""
        out = []
        for weight in self._roles:
            kernel = (
                kernels.LINEAR
                if rows > kernels.SMALL_ROWS
                else kernels.table().kernel(weight, rows)
            )
            out += [_KERNEL_CODES[kernel], kernels.padded_rows(rows)]
        return out

    @staticmethod
    def _mask(mask: torch.Tensor | None, seq: int, prefixes: set[int]) -> tuple[int, Any]:
        """The mask as ``decoder.cpp`` reads it: (mode, uint8 rows)."""
        if mask is None:
            return CAUSAL, _NO_MASK
        columns = mask.shape[1]
        if columns == seq:
            return NEW_TOKENS, mask.to(dtype=torch.uint8).contiguous()
        wrong = sorted(p for p in prefixes if columns != p + seq)
        if wrong:
            raise ValueError(f"mask has {columns} columns; expected {seq} or {wrong[0] + seq}")
        return WHOLE, mask.to(dtype=torch.uint8).contiguous()
