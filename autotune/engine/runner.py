"""One forward pass over the target's own weights, for every decoding method.

The runner computes each decoder layer itself (``engine.layers``), so that a draft pass
can leave sublayers out without touching the model, tokens can carry explicit positions,
attention can follow any mask (chains, trees, the proxy's prefix mask), and the KV cache
is ours.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autotune.engine import kernels, layers
from autotune.engine.kvcache import KVCache
from autotune.engine.segment import LayerRows, Segment
from autotune.engine.skip import NO_SKIP, SkipMask
from autotune.engine.stack import NativeStack
from autotune.engine.static import StaticStep, enabled_by_default

HOST = torch.device("cpu")
# Maps the final-normed hidden states [S, H] to more rows [R, H] for the lm_head product.
ExtraRows = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [S, V] float32 (or [1, V] when only the last position was asked for)
    hidden: torch.Tensor  # [S, H] output of the last layer, before the final norm
    extra_logits: torch.Tensor | None = None  # [R, V] for the rows ``extra_rows`` gave


class Runner:
    """Wraps a LLaMA-family ``*ForCausalLM`` (LLaMA, Vicuna, Mistral, Qwen2 blocks)."""

    def __init__(
        self,
        model: Any,
        product: layers.Product = layers.linear,
        native: bool = True,
        static: bool | None = None,
        how: str = "graph",
    ):
        """``model``: a transformers ``*ForCausalLM`` (typed ``Any``: its submodules are
        named by convention). ``product``: how weights are multiplied
        (``layers.plain_linear`` to compare with torch's own kernels). ``native``: run the
        layers in the engine's C++ code where it applies (``engine.stack``); False keeps
        the Python layers (``engine.layers``), which compute the same thing. ``static``:
        run the calls that fit in the fixed-shape step over a fixed cache
        (``engine.static``), on CUDA as ``how`` says (graph, compile or eager); None: on
        a GPU only."""
        self.model = model.eval()
        self.product = product
        self.config = model.config
        inner = model.model
        self.embed: Any = inner.embed_tokens
        self.layers: list[Any] = list(inner.layers)
        self.norm: Any = inner.norm
        self.rotary: Any = inner.rotary_emb
        self.lm_head: Any = model.lm_head
        self.num_layers = len(self.layers)
        self.device: torch.device = self.embed.weight.device
        self.dtype: torch.dtype = self.embed.weight.dtype
        self.eos_token_ids = eos_ids(model)
        # q/k/v and gate/up as one product each: 1.5 ms of a 35 ms one-token forward and
        # 2.5 of 60 at 16 tokens on 2 cores (fewer calls, larger parallel tasks)
        self.fused = [
            (
                layers.Fused.of([a.q_proj, a.k_proj, a.v_proj]),
                layers.Fused.of([layer.mlp.gate_proj, layer.mlp.up_proj]),
            )
            for layer in self.layers
            for a in (layer.self_attn,)
        ]
        if self.device.type == "cpu" and product is layers.linear:
            # which kernel each weight takes, measured now (or read from this machine's
            # record) rather than inside the first timed decoding
            kernels.table().measure(
                [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
                + [f.weight for pair in self.fused for f in pair]
            )
        self.stack = NativeStack.of(self) if native else None
        use_static = enabled_by_default(self.device) if static is None else static
        self.static = StaticStep.of(self, how) if use_static else None

    def new_cache(self, capacity: int = 512, own: bool = False) -> KVCache:
        """A cache for one sequence: where the runner has a fixed-shape step, a lane of its
        storage, unless ``own`` (storage of its own, always run eagerly): for caches kept
        long or many at once, such as frozen traces, which would hold lanes that the
        sequences being decoded need (a decoding in lane k runs lanes 0 to k)."""
        if self.static is not None and not own:
            return self.static.lend(capacity)
        return KVCache.for_config(self.config, self.num_layers, self.dtype, self.device, capacity)

    @property
    def input_device(self) -> torch.device:
        """Where a call's tokens, positions and masks are best made: on the host when the
        runner has a fixed-shape step (it sends a call's inputs to the device in one
        copy, ``engine.staging``; one tensor made on a GPU from a list is a copy that
        waits for it), else on the runner's device. Either works for every call."""
        return HOST if self.static is not None else self.device

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The lm_head over final-normed hidden states, in float32."""
        return self.product(normed, self.lm_head).float()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        *,
        mask: torch.Tensor | None = None,
        skip: SkipMask = NO_SKIP,
        last_only: bool = False,
        extra_rows: ExtraRows | None = None,
    ) -> ForwardOutput:
        """Run ``tokens`` [S] at ``positions`` [S], appending their keys/values to ``cache``.

        mask: bool, True = may attend. [S, S] over the new tokens (the cached prefix is
        fully visible), or [S, P + S] over the prefix and the new tokens. None means
        causal. Layers whose attention is skipped neither read nor write the cache.
        extra_rows: maps the final-normed hidden states [S', H] to more rows [R, H] that go
        through the lm_head in the same product (Medusa heads sharing it: on CPU one
        product over more rows costs less than a second product).
        """
        segment = Segment(tokens, positions, cache, mask, last_only)
        return self.forward_batch([segment], skip=skip, extra_rows=extra_rows)[0]

    @torch.inference_mode()
    def forward_batch(
        self,
        segments: list[Segment],
        *,
        skip: SkipMask = NO_SKIP,
        extra_rows: ExtraRows | None = None,
    ) -> list[ForwardOutput]:
        """One forward over several sequences' tokens, one output per segment: the weight
        products run once over all their rows (what batching saves: a product over B rows
        streams the weights once), attention runs per sequence over its own cache. Each
        segment is computed as ``forward`` computes it alone (``extra_rows``: its extra
        logits come in the same blocks)."""
        if (fixed := self._static_forward(segments, skip, extra_rows)) is not None:
            return fixed
        counts = [len(segment.tokens) for segment in segments]
        total = sum(counts)
        tokens, positions = segments[0].tokens, segments[0].positions
        if len(segments) > 1:
            tokens = torch.cat([s.tokens for s in segments])
            positions = torch.cat([s.positions for s in segments])
        tokens, positions = tokens.to(self.device), positions.to(self.device)  # input_device
        hidden = self.embed(tokens.view(1, total))
        rope = self.rotary(hidden, positions.view(1, total))
        layer_rows = LayerRows(rope, segments, counts, skip)
        if self.stack is not None:
            hidden = hidden[0]
            self.stack.run(hidden, layer_rows)
        else:
            hidden = self._python_layers(hidden, layer_rows)[0]
        bounds = list(itertools.accumulate(counts, initial=0))
        hiddens = [hidden[a:b] for a, b in itertools.pairwise(bounds)]
        picked = [h[-1:] if s.last_only else h for h, s in zip(hiddens, segments)]
        normed = layers.rms_norm(self.norm, picked[0] if len(picked) == 1 else torch.cat(picked))
        rows = len(normed)
        if extra_rows is None:
            logits, extra = self.logits(normed), None
        else:
            both = self.logits(torch.cat([normed, extra_rows(normed)]))
            logits, extra = both[:rows], both[rows:]
        if len(segments) == 1:
            return [ForwardOutput(logits=logits, hidden=hidden, extra_logits=extra)]
        outputs, start = [], 0
        for h, p in zip(hiddens, picked):
            end = start + len(p)
            mine = None
            if extra is not None:  # k blocks of ``rows`` rows -> k blocks of this segment's
                mine = extra.view(-1, rows, extra.shape[-1])[:, start:end].reshape(
                    -1, extra.shape[-1]
                )
            outputs.append(ForwardOutput(logits=logits[start:end], hidden=h, extra_logits=mine))
            start = end
        return outputs

    def _static_forward(
        self, segments: list[Segment], skip: SkipMask, extra_rows: ExtraRows | None
    ) -> list[ForwardOutput] | None:
        """The call run in the fixed-shape step (``engine.static``), or None where it
        cannot be: no step, or a call the step does not fit (``StaticStep.fits``)."""
        if self.static is None:
            return None
        fixed = self.static.forward(segments, skip, extra_rows)
        if fixed is None:
            return None
        return [
            ForwardOutput(logits=logits, hidden=hidden, extra_logits=extra)
            for logits, hidden, extra in fixed
        ]

    def _python_layers(self, hidden: torch.Tensor, rows: LayerRows) -> torch.Tensor:
        """The decoder layers over ``hidden`` [1, S, H] (the segments' rows one after
        another), written out in torch operations."""
        rope, segments, counts, skip = rows.rope, rows.segments, rows.counts, rows.skip
        bounds = list(itertools.accumulate(counts, initial=0))
        rotations = [
            layers.Rotation((rope[0][:, a:b], rope[1][:, a:b]))
            for a, b in itertools.pairwise(bounds)
        ]
        masks: dict[tuple[int, int], torch.Tensor | None] = {}
        for index, layer in enumerate(self.layers):
            if index not in skip.attention:
                parts = []
                for b, segment in enumerate(segments):
                    prefix = segment.cache.length(index)
                    if (b, prefix) not in masks:
                        masks[b, prefix] = additive(
                            visibility(segment.mask, prefix, counts[b], self.device), self.dtype
                        )
                    parts.append(
                        layers.AttentionSegment(
                            counts[b], rotations[b], masks[b, prefix], segment.cache
                        )
                    )
                hidden = layers.segmented_attention(
                    layer.self_attn,
                    layers.rms_norm(layer.input_layernorm, hidden),
                    parts,
                    index,
                    self.product,
                    qkv=self.fused[index][0],
                    residual=hidden,
                )
            if index not in skip.mlp:
                hidden = layers.mlp(
                    layer.mlp,
                    layers.rms_norm(layer.post_attention_layernorm, hidden),
                    self.product,
                    gate_up=self.fused[index][1],
                    residual=hidden,
                )
        return hidden


def visibility(mask: torch.Tensor | None, prefix: int, seq: int, device) -> torch.Tensor | None:
    """The bool mask [S, P + S] (True = may attend) that attention takes, from a mask over
    the new tokens [S, S] (the cached prefix fully visible) or over the prefix and the new
    tokens [S, P + S]; None = causal (and None for one query: it sees everything)."""
    if mask is None:
        if seq == 1:
            return None
        mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    mask = mask.to(device=device, dtype=torch.bool)
    if mask.shape[1] == seq:
        return torch.cat([torch.ones(seq, prefix, dtype=torch.bool, device=device), mask], dim=1)
    if mask.shape[1] != prefix + seq:
        raise ValueError(f"mask has {mask.shape[1]} columns; expected {seq} or {prefix + seq}")
    return mask


def additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask as the additive one attention turns it into (0 where visible, -inf
    elsewhere), made once per forward rather than in every layer."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def eos_ids(model) -> frozenset[int]:
    """The tokens that end a sequence: the config's and the generation config's (an
    instruction-tuned model's end of turn is often in the latter alone), as
    transformers' ``generate`` stops at either."""
    ids: set[int] = set()
    for config in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(config, "eos_token_id", None)
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return frozenset(ids)
