"""One forward pass over the target's own modules, for every decoding method.

The runner calls each decoder layer's ``self_attn`` and ``mlp`` itself, so that a draft
pass can leave sublayers out without touching the model, tokens can carry explicit
positions, and attention can follow any mask (chains, trees, the proxy's prefix mask).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autotune.engine import small_matmul
from autotune.engine.kvcache import KVCache
from autotune.engine.skip import NO_SKIP, SkipMask


@dataclass
class ForwardOutput:
    logits: torch.Tensor   # [S, V] (or [1, V] when only the last position was asked for)
    hidden: torch.Tensor   # [S, H] output of the last layer, before the final norm
    extra_logits: torch.Tensor | None = None  # [R, V] for the rows ``extra_rows`` gave


class Runner:
    """Wraps a LLaMA-family ``*ForCausalLM`` (LLaMA, Vicuna, Mistral, Qwen2 blocks)."""

    def __init__(self, model: torch.nn.Module, fast_small_matmul: bool = True):
        self.model = model.eval()
        if fast_small_matmul:
            small_matmul.enable(model)
        self.config = model.config
        inner = model.model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        self.num_layers = len(self.layers)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.eos_token_ids = _eos_ids(self.config)

    def new_cache(self, capacity: int = 512) -> KVCache:
        return KVCache.for_config(self.config, self.num_layers, self.dtype, self.device, capacity)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                mask: torch.Tensor | None = None, skip: SkipMask = NO_SKIP,
                last_only: bool = False, extra_rows=None) -> ForwardOutput:
        """Run ``tokens`` [S] at ``positions`` [S], appending their keys/values to ``cache``.

        mask: bool, True = may attend. [S, S] over the new tokens (the cached prefix is
        fully visible), or [S, P + S] over the prefix and the new tokens. None means
        causal. Layers whose attention is skipped neither read nor write the cache.
        extra_rows: maps the final-normed hidden states [S', H] to more rows [R, H] that go
        through the lm_head in the same product (Medusa heads sharing it: on CPU one
        product over more rows costs less than a second product).
        """
        seq = tokens.shape[0]
        hidden = self.embed(tokens.view(1, seq))
        rope = self.rotary(hidden, positions.view(1, seq))
        masks: dict[int, torch.Tensor | None] = {}
        for index, layer in enumerate(self.layers):
            if index not in skip.attention:
                prefix = cache.length(index)
                if prefix not in masks:
                    masks[prefix] = additive_mask(mask, prefix, seq, self.dtype, self.device)
                attn_out, _ = layer.self_attn(
                    hidden_states=layer.input_layernorm(hidden), position_embeddings=rope,
                    attention_mask=masks[prefix], past_key_values=cache)
                hidden = hidden + attn_out
            if index not in skip.mlp:
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = hidden[0]
        normed = self.norm(hidden[-1:] if last_only else hidden)
        if extra_rows is None:
            return ForwardOutput(logits=self.lm_head(normed).float(), hidden=hidden)
        extra = extra_rows(normed)
        logits = self.lm_head(torch.cat([normed, extra])).float()
        return ForwardOutput(logits=logits[: len(normed)], hidden=hidden,
                             extra_logits=logits[len(normed):])


def additive_mask(mask: torch.Tensor | None, prefix: int, seq: int, dtype: torch.dtype,
                  device) -> torch.Tensor | None:
    """The float mask [1, 1, S, P + S] attention modules take, from a bool mask (True = may
    attend) over the new tokens [S, S] (the cached prefix fully visible) or over the prefix
    and the new tokens [S, P + S]; None = causal (and None for one query: it sees all)."""
    if mask is None:
        if seq == 1:
            return None
        mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    if mask.shape[1] == seq:
        visible = torch.ones(seq, prefix, dtype=torch.bool, device=device)
        mask = torch.cat([visible, mask.to(device)], dim=1)
    elif mask.shape[1] != prefix + seq:
        raise ValueError(f"mask has {mask.shape[1]} columns; expected {seq} or {prefix + seq}")
    additive = torch.zeros(mask.shape, dtype=dtype, device=device)
    additive.masked_fill_(~mask.to(device), torch.finfo(dtype).min)
    return additive.view(1, 1, seq, -1)


def _eos_ids(config) -> frozenset[int]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
