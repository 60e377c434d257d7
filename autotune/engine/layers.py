"""The arithmetic of a LLaMA-family decoder block, written out over the model's own weights.

The runner, the EAGLE head and the GLIDE draft call these functions instead of the
modules' ``forward``: the KV cache, the attention mask and the matrix products are then
ours, whatever transformers release is installed, and nothing about the model is patched.
Weights stay in the model's modules (``q_proj``, ``mlp.gate_proj`` ...); norms and the
rotary embedding are called as the modules they are.

Shapes: ``x`` is [B, S, H]; attention tensors are [B, heads, S, head_dim]. Modules are
typed ``Any``: transformers names their submodules by convention (``q_proj``), which
static typing cannot follow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from autotune.engine import kernels, native

_HALF = (torch.float16, torch.bfloat16)

# How a block multiplies by a weight: ``linear`` (the default) or ``plain_linear``.
Product = Callable[[torch.Tensor, torch.nn.Linear], torch.Tensor]


# The rules by which the layers take a fused form (each ``x -> bool``: whether it applies
# to ``x``), by name: what the benchmarks and tests ask as a GPU answers them.
FUSION_RULES = (
    "fused_norm_applies",
    "fused_rotation_applies",
    "fused_residual_applies",
    "fused_products_applies",
)


@contextlib.contextmanager
def forms_answered(answers: dict[str, Callable[[torch.Tensor], bool]]) -> Iterator[None]:
    """Within it, each rule named (of ``FUSION_RULES``) answered by its callable instead:
    how the benchmarks compare the forms (a step is recorded in the forms its rules
    answered when it was). Each rule is back as it was after."""
    kept = {name: globals()[name] for name in answers}
    globals().update(answers)
    try:
        yield
    finally:
        globals().update(kept)


def plain_linear(x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    """torch's own product, whatever the input's size (for comparisons)."""
    return F.linear(x, module.weight, module.bias)


def linear(x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    """``module(x)``, by the faster of torch's CPU kernels for the input's row count and
    the weight's shape on this machine (``engine.kernels``: measured once per machine).
    Plain and speculative decoding both go through here, so their ratio stays fair."""
    if x.device.type != "cpu" or torch.is_grad_enabled():
        return F.linear(x, module.weight, module.bias)
    rows = x.numel() // x.shape[-1]
    kernel = (
        kernels.LINEAR if rows > kernels.SMALL_ROWS else kernels.table().kernel(module.weight, rows)
    )
    if kernel == kernels.LINEAR:
        return F.linear(x, module.weight, module.bias)
    flat = x.reshape(rows, x.shape[-1])
    if kernel == kernels.SMALL:
        out = native.product(flat, module.weight)
    else:
        out = kernels.transposed_product(flat, module.weight)
    if module.bias is not None:
        out = out + module.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` for a LLaMA RMSNorm module, by torch's fused kernel where that is the
    faster: in float32 (the same values as the module's operations, measured bit for bit,
    at a fraction of their per-operation overhead), and in half precision on a GPU. There
    the module dispatches six operations (pow, mean, add, rsqrt, two products), 12 of the
    27.5 a decoding step's layer makes in bfloat16 (``benchmarks/step_operations.py``),
    each a few microseconds of a graph's replay; the fused kernel is one. Its values may
    differ from the module's in the last bit (it rounds once, the module twice); plain and
    speculative decoding both come here, so their outputs stay comparable. Other norms,
    and half precision on the CPU (where the module keeps transformers' values), call the
    module."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or norm.weight.dtype != x.dtype or not fused_norm_applies(x):
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def fused_norm_applies(x: torch.Tensor) -> bool:
    """Whether ``rms_norm`` takes torch's fused kernel for ``x`` (see there)."""
    return x.dtype == torch.float32 or (x.dtype in _HALF and x.device.type != "cpu")


# Up to this many positions a GPU rotates by one product with a rotation matrix per
# position (``Rotation``): every fixed-shape step (its largest bucket is 64 rows) and a
# verification; a longer prefill keeps the elementwise form, whose memory does not grow
# with the head size squared.
MATRIX_ROTATION_ROWS = 64


class Rotation:
    """RoPE at one forward's positions, prepared once for all its layers: rope = (cos, sin)
    [B, S, D] from the model's rotary embedding; cos, and sin with the sign of the
    half-rotation folded in, are kept shaped for [B, heads, S, D], so that rotating
    x [B, heads, S, D] is four operations (the textbook form, x * cos + cat(-x2, x1) * sin,
    takes nine and gives the same bits). Off the CPU (``fused_rotation_applies``) it is one:
    a batched product with each position's rotation matrix, made once for all layers."""

    def __init__(self, rope: tuple[torch.Tensor, torch.Tensor]):
        cos, sin = rope
        self.half = cos.shape[-1] // 2
        self.cos = cos.unsqueeze(1)
        self.sin = torch.cat((-sin[..., : self.half], sin[..., self.half :]), dim=-1).unsqueeze(1)
        self._matrix: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not fused_rotation_applies(x):
            return x * self.cos + x.roll(self.half, dims=-1) * self.sin
        if x.shape[-2] <= MATRIX_ROTATION_ROWS:
            # [B, S, heads, D] (the projection's own layout) times [B, S, D, D]
            return torch.matmul(x.transpose(1, 2), self.matrix()).transpose(1, 2)
        return torch.addcmul(x * self.cos, x.roll(self.half, dims=-1), self.sin)

    def matrix(self) -> torch.Tensor:
        """[B, S, D, D]: row e of a position's matrix holds what x[e] adds to each rotated
        x[d]: cos[d] on the diagonal, the signed sin[d] at row d + D/2 (mod D), the
        position's half-rotation, so a row times it is x * cos + roll(x) * sin."""
        if self._matrix is None:
            cos, sin = self.cos.squeeze(1), self.sin.squeeze(1)
            rolled = torch.diag_embed(sin).roll(self.half, dims=-2)
            self._matrix = torch.diag_embed(cos).add_(rolled)
        return self._matrix


def fused_rotation_applies(x: torch.Tensor) -> bool:
    """Whether ``Rotation`` takes its GPU forms: off the CPU, where each operation is a
    kernel of a step's replay (a 30-layer model's one-token step: 90 operations to rotate
    its queries and keys elementwise, 30 products and the matrices' 6 by matrix,
    ``benchmarks/step_operations.py``). The product sums each value's two terms in float32
    and rounds once, where the elementwise form rounds each product first: values may
    differ in the last bit; plain and speculative decoding both come here. On the CPU the
    elementwise operations keep the textbook rotation's bits."""
    return x.device.type != "cpu"


def heads_of(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[B, S, heads * D] -> [B, heads, S, D]."""
    batch, seq, _ = x.shape
    return x.view(batch, seq, -1, head_dim).transpose(1, 2)


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query heads repeated; mask: bool
    (True = may attend) or additive float, broadcastable to [B, heads, S, T]; None: every
    key is visible. Returns [B, S, heads * D]."""
    # grouped-query heads are matched inside the kernel (enable_gqa), not by copying the
    # cache's keys and values to every query head on every layer of every step
    gqa = query.shape[1] != keys.shape[1]
    if query.device.type == "cpu" and query.dtype in _HALF:
        # torch's fused CPU kernel blocks the keys by their count, so in half precision a
        # token's output can differ in its last bit between a verify pass and a one-token
        # step, enough to flip a greedy choice: the math kernel (float32 inside) gives
        # each query the same value either way, so speculative output stays exact
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa
            )
    else:
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa
        )
    batch, _, seq, _ = out.shape
    return out.transpose(1, 2).reshape(batch, seq, -1)


class Fused:
    """Linear layers over one input multiplied as one product: their weights become row
    slices of one tensor (no extra memory; the modules read the same rows), so a step
    makes one call where it made two or three (where ``fused_products_applies``)."""

    def __init__(self, modules: list[torch.nn.Linear]):
        self.modules = modules
        self.sizes = [m.weight.shape[0] for m in modules]
        biases = [m.bias for m in modules]
        self.bias = (
            None
            if all(b is None for b in biases)
            else torch.cat(
                [
                    b.detach() if b is not None else modules[0].weight.new_zeros(size)
                    for b, size in zip(biases, self.sizes)
                ]
            )
        )
        self.move(torch.cat([m.weight.detach() for m in modules]))

    def move(self, weight: torch.Tensor) -> None:
        """Hold the fused weight in ``weight`` (the same values elsewhere in memory), the
        modules' weights its row slices."""
        self.weight = weight
        offset = 0
        for module, size in zip(self.modules, self.sizes):
            module.weight.data = weight[offset : offset + size]
            offset += size

    @classmethod
    def of(cls, modules: list[torch.nn.Linear]) -> Fused:
        """The fused product of these modules, made once (kept on the first module): a
        second runner over the same model shares it rather than copying the weights."""
        found = getattr(modules[0], "_autotune_fused", None)
        if found is None or found.sizes != [m.weight.shape[0] for m in modules]:
            found = cls(modules)
            object.__setattr__(modules[0], "_autotune_fused", found)
        return found

    def __call__(self, x: torch.Tensor, product: Product) -> tuple[torch.Tensor, ...]:
        return product(x, self).split(self.sizes, dim=-1)  # type: ignore[arg-type]


def fused_products_applies(x: torch.Tensor) -> bool:
    """Whether the layers multiply by a ``Fused`` weight (queries, keys and values as one
    product, the MLP's gate and up as one) where they have one: everywhere. A rule all
    the same, so that the GPU check can record the step with the modules' own products
    (``benchmarks/graph_step.py``): one product of a wider weight saves launches at one
    row, but at 64 rows a GPU's matrix kernels are chosen by shape, and the 13B verify
    step's rise at 64 tokens, where transformers' unfused one stays flat, is not yet
    explained (docs/gpu.md). Each output column is its own weight row's product either
    way; a kernel chosen for the other shape may sum in another order (the last bit)."""
    return True


def self_attention(
    attention: Any,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor] | Rotation,
    mask: torch.Tensor | None,
    cache=None,
    layer: int = 0,
    product: Product = linear,
    qkv: Fused | None = None,
) -> torch.Tensor:
    """One attention sublayer (its input already normed): queries, keys and values of x,
    rotated at their positions; with ``cache`` (B = 1), keys and values are appended to
    layer ``layer`` of it and the queries see the whole layer, as ``mask`` allows.
    ``qkv``: the three projections fused (``Fused``): queries and keys are then rotated
    together, as the adjacent columns they are."""
    return segmented_attention(
        attention, x, [AttentionSegment(x.shape[1], rope, mask, cache)], layer, product, qkv
    )


class AttentionSegment:
    """One sequence's tokens in an attention sublayer over a batch: ``rows`` consecutive
    tokens, their rotation, their mask and their own cache (see ``self_attention``)."""

    def __init__(
        self,
        rows: int,
        rope: tuple[torch.Tensor, torch.Tensor] | Rotation,
        mask: torch.Tensor | None,
        cache=None,
    ):
        self.rows = rows
        self.rotate = rope if isinstance(rope, Rotation) else Rotation(rope)
        self.mask = mask
        self.cache = cache


def segmented_attention(
    attention: Any,
    x: torch.Tensor,
    segments: list[AttentionSegment],
    layer: int = 0,
    product: Product = linear,
    qkv: Fused | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``self_attention`` over x [1, S, H] holding several sequences' tokens, one segment
    after another: the products run once over all of them, each segment's queries see only
    its own cache and tokens. ``residual``: added to the output (``add_product``: the
    caller gives it up)."""
    dim = attention.head_dim
    if qkv is not None and not fused_products_applies(x):
        qkv = None  # the modules' own products: row slices of the fused weight
    if qkv is None:
        queries = heads_of(product(x, attention.q_proj), dim)
        keys_all = heads_of(product(x, attention.k_proj), dim)
        values_all = heads_of(product(x, attention.v_proj), dim)
    else:
        out = product(x, qkv)  # type: ignore[arg-type]
        q_cols, k_cols, _ = qkv.sizes
        joint = heads_of(out[..., : q_cols + k_cols], dim)
        values_all = heads_of(out[..., q_cols + k_cols :], dim)
    scale = getattr(attention, "scaling", dim**-0.5)
    parts, start = [], 0
    for segment in segments:
        end = start + segment.rows
        if qkv is None:
            query = segment.rotate(queries[:, :, start:end])
            keys = segment.rotate(keys_all[:, :, start:end])
        else:
            query, keys = segment.rotate(joint[:, :, start:end]).split(
                [q_cols // dim, k_cols // dim], dim=1
            )
        values = values_all[:, :, start:end]
        if segment.cache is not None:
            keys, values = segment.cache.update(keys, values, layer)
        parts.append(attend(query, keys, values, segment.mask, scale))
        start = end
    attended = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return add_product(residual, attended, attention.o_proj, product)


def mlp(
    block: Any,
    x: torch.Tensor,
    product: Product = linear,
    gate_up: Fused | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """A gated MLP sublayer (its input already normed): down(act(gate(x)) * up(x));
    ``gate_up``: the gate and up projections fused (``Fused``); ``residual``: added to
    the output (``add_product``: the caller gives it up)."""
    if gate_up is None or not fused_products_applies(x):
        gate, up = product(x, block.gate_proj), product(x, block.up_proj)
    else:
        gate, up = gate_up(x, product)
    return add_product(residual, block.act_fn(gate) * up, block.down_proj, product)


def add_product(
    residual: torch.Tensor | None, x: torch.Tensor, module: torch.nn.Linear, product: Product
) -> torch.Tensor:
    """``residual + product(x, module)`` (just the product without a residual). Where
    ``fused_residual_applies``, the sum is the product's own: ``residual`` is added in
    place by the matrix product's epilogue (``addmm_``, one kernel where there were two),
    so the caller must not read ``residual`` again."""
    if residual is None:
        return product(x, module)
    if (
        fused_residual_applies(x)
        and (product is linear or product is plain_linear)  # off the CPU both are F.linear
        and module.bias is None
        and not torch.is_grad_enabled()  # an in-place sum autograd may need the old value of
        and residual.is_contiguous()
    ):
        flat = residual.view(-1, residual.shape[-1])
        flat.addmm_(x.reshape(-1, x.shape[-1]), module.weight.t())
        return residual
    return residual + product(x, module)


def fused_residual_applies(x: torch.Tensor) -> bool:
    """Whether ``add_product`` adds the residual inside the product: off the CPU, where
    each operation is a kernel of a step's replay (60 fewer of a 30-layer model's one-token
    step, ``benchmarks/step_operations.py``). The sum is rounded once, with the product,
    not after it: values may differ in the last bit; plain and speculative decoding both
    come here. The CPU keeps its own kernels' products (``linear``) and their bits."""
    return x.device.type != "cpu"
