"""The EAGLE draft head: the module, and the upstream checkpoint layout.

Layout (SafeAILab/EAGLE, EAGLE-1 and EAGLE-2): a folder with ``config.json``, the
target's LlamaConfig with ``num_hidden_layers: 1``, and ``model.safetensors`` or
``pytorch_model.bin`` holding ``fc.weight`` [H, 2H] (+ ``fc.bias``), ``layers.0.*`` (a
LLaMA decoder layer whose first layer has no ``input_layernorm``) and usually a copy of
the target's ``embed_tokens.weight``.

The head reads pairs (feature f_t, token x_{t+1}) at position t. f_t is the target's last
hidden state after its final norm (what its lm_head reads); the head's output at t is its
guess of f_{t+1}, which the target's frozen lm_head turns into a guess of x_{t+2}, and
which the head reads back as the feature of the next pair when it drafts further ahead.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.engine import layers
from autotune.engine.kvcache import KVCache
from autotune.engine.runner import visibility
from autotune.engine.staging import sent
from autotune.files import write_atomic
from autotune.heads.cache import loading_heads
from autotune.heads.medusa import HeadsError, read_weights, write_heads_folder

CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_PREFIXES = ("ea_layer.", "module.", "model.")


class EagleHead(nn.Module):
    def __init__(self, config, bias: bool = True):
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        super().__init__()
        if getattr(config, "_attn_implementation", None) in (None, "flash_attention_2"):
            config._attn_implementation = "sdpa"  # a bare module: nothing else picks one
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)
        )
        # EAGLE's first layer reads fc's output without a norm: its input is already a
        # feature on the target's normed scale
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary = LlamaRotaryEmbedding(config)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def new_cache(self, capacity: int = 512) -> KVCache:
        weight = self.fc.weight
        return KVCache.for_config(
            self.config, len(self.layers), weight.dtype, weight.device, capacity
        )

    def forward(
        self,
        features: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predicted next features [B, S, H] for pairs (features, embeds) [B, S, H] at
        ``positions`` [B, S].

        With ``cache`` (B = 1), keys/values are appended to it and ``mask`` is a bool mask
        as ``Runner.forward`` takes it ([S, S] or [S, P + S], None = causal). Without it,
        ``mask`` is a bool or additive float mask [B, 1, S, S] (None = causal).
        """
        if cache is not None:
            rows = HeadRows(features[0], embeds[0], positions.reshape(-1), cache, mask)
            return self.forward_rows([rows])[None]
        hidden = self.pairs(features, embeds)
        rope = self.rotary(hidden, positions.expand(hidden.shape[0], -1))
        seq = hidden.shape[1]
        if mask is None and seq > 1:
            mask = torch.ones(seq, seq, dtype=torch.bool, device=hidden.device).tril()
        segment = layers.AttentionSegment(seq, rope, mask)
        return self.decoder_layers(hidden, [segment])

    def forward_rows(self, sequences: list[HeadRows]) -> torch.Tensor:
        """The predicted next features [N, H] of several sequences' rows, one after
        another: each sequence's keys and values go to its own cache and its rows see
        only that cache, as its mask allows; the products run once over all N rows."""
        features = torch.cat([s.features for s in sequences])
        embeds = torch.cat([s.embeds for s in sequences])
        hidden = self.pairs(features, embeds)[None]
        positions = torch.cat([s.positions for s in sequences]).to(hidden.device)  # host's too
        cos, sin = self.rotary(hidden, positions[None])
        segments, start = [], 0
        for s in sequences:
            count = s.positions.shape[0]
            rope = (cos[:, start : start + count], sin[:, start : start + count])
            mask = visibility(s.mask, s.cache.length(0), count, hidden.device)
            segments.append(layers.AttentionSegment(count, rope, mask, s.cache))
            start += count
        return self.decoder_layers(hidden, segments)[0]

    def pairs(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The first layer's input [..., H]: fc over each pair's token embedding and
        feature [..., H] side by side."""
        return layers.linear(torch.cat([embeds, features], dim=-1), self.fc)

    def decoder_layers(self, hidden: torch.Tensor, segments: list[layers.AttentionSegment]):
        """The head's decoder layers over ``hidden`` [B, S, H], attending per segment."""
        for index in range(len(self.layers)):
            layer: Any = self.layers[index]  # a transformers decoder layer
            hidden = hidden + layers.segmented_attention(
                layer.self_attn, layer.input_layernorm(hidden), segments, index
            )
            hidden = hidden + layers.mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        return hidden


@dataclass
class HeadRows:
    """One sequence's pairs for the head: features and token embeddings [S, H] at
    ``positions`` [S], appended to ``cache``; ``mask`` as ``Runner.forward`` takes it."""

    features: torch.Tensor
    embeds: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    mask: torch.Tensor | None = None


@dataclass
class CommitRows:
    """The pairs the target confirmed since the last proposal, as its forward left them:
    its hidden states before its final norm [S, H] and the token after each [S] (on the
    host or the device), at ``positions`` [S], appended to ``cache``. The target's final
    ``norm`` and ``embed`` make them the head's pairs (``pairs``): eagerly here, inside
    the head's fixed-shape step there (``heads.static_head``), where those few dozen
    launches a proposal are not paid around the step."""

    hidden: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    norm: nn.Module
    embed: nn.Module
    mask: None = None  # a commit is causal

    def pairs(self) -> HeadRows:
        """The rows as the eager head takes them."""
        tokens = sent(self.tokens, self.hidden.device)
        return HeadRows(self.norm(self.hidden), self.embed(tokens), self.positions, self.cache)


def head_config(target_config):
    """The head's config: the target's, with one layer (what upstream heads ship)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    config.tie_word_embeddings = False
    return config


def save_eagle_head(
    head: EagleHead,
    folder: str | Path,
    embed_weight: torch.Tensor,
    base_model: str,
    extra: dict | None = None,
) -> Path:
    """Write the upstream layout (``model.safetensors``; the target's embedding is stored
    too, as upstream checkpoints carry it)."""
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    state["embed_tokens.weight"] = embed_weight
    config = head.config.to_dict()
    config.update(
        {
            "architectures": ["LlamaForCausalLM"],
            "num_hidden_layers": len(head.layers),
            "bias": head.fc.bias is not None,
            "base_model_name_or_path": base_model,
            **(extra or {}),
        }
    )
    return write_heads_folder(folder, WEIGHTS[0], state, config)


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    state = read_weights(
        folder,
        WEIGHTS,
        "EAGLE",
        "pass an EAGLE head folder (config.json + model.safetensors or "
        "pytorch_model.bin), or train one with `autotune heads train "
        "--kind eagle`",
    )
    out = {}
    for key, value in state.items():
        for prefix in _PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def _read_config(folder: Path):
    from transformers import LlamaConfig

    try:
        raw = json.loads((folder / CONFIG).read_text())
    except OSError:
        raise HeadsError(
            f"no {CONFIG} in {folder}: an EAGLE head folder needs the head's LlamaConfig"
        ) from None
    except ValueError as exc:
        raise HeadsError(f"{folder / CONFIG} is not valid JSON: {exc}") from None
    keep = {k: v for k, v in raw.items() if k not in ("autotune", "architectures")}
    return LlamaConfig(**keep)


def load_eagle_head(
    folder: str | Path,
    target_config,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> EagleHead:
    """Load a head in the upstream layout and check it fits the target. The layer count
    and fc's bias come from the weights; the target's embedding is used, not the copy."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise HeadsError(f"EAGLE head folder {folder} not found")
    with loading_heads(folder, "eagle"):
        config = _read_config(folder)
        state = _read_state(folder)
        if "fc.weight" not in state:
            raise HeadsError(
                f"{folder}: no 'fc.weight' among the weights: not an EAGLE-1/2 head "
                "(EAGLE-3 heads, with fc over three layers' features, are not supported)"
            )
        hidden = state["fc.weight"].shape[0]
        if state["fc.weight"].shape[1] != 2 * hidden:
            raise HeadsError(
                f"{folder}: fc.weight is {list(state['fc.weight'].shape)}; an EAGLE-1/2 "
                f"head has [{hidden}, {2 * hidden}]"
            )
        if (hidden, config.vocab_size) != (target_config.hidden_size, target_config.vocab_size):
            raise HeadsError(
                f"the head in {folder} is for hidden size {hidden} and vocabulary "
                f"{config.vocab_size}; the model has {target_config.hidden_size} and "
                f"{target_config.vocab_size}: train a head for this model with "
                "`autotune heads train --kind eagle`"
            )
        indices = (int(k.split(".")[1]) for k in state if k.startswith("layers."))
        layers = 1 + max(indices, default=-1)
        if layers < 1:
            raise HeadsError(f"{folder}: no decoder layer weights ('layers.0.*')")
        config.num_hidden_layers = layers
        head = EagleHead(config, bias="fc.bias" in state)
        expected = {k for k in head.state_dict() if not k.startswith("rotary.")}
        missing = expected - state.keys()
        if missing:
            raise HeadsError(f"{folder}: weights missing for {sorted(missing)[:4]}")
        head.load_state_dict({k: state[k] for k in expected}, strict=False)
        return head.to(dtype=dtype, device=device).eval().requires_grad_(False)


# --- draft vocabulary ------------------------------------------------------------------

DRAFT_VOCAB = "draft_vocab.json"


def save_draft_vocab(folder: str | Path, token_counts: dict[int, int]) -> Path:
    """Token ids by how often the target emitted them while the head was trained (most
    frequent first): a draft vocabulary is a prefix of this list."""
    ranked = sorted(token_counts, key=lambda t: (-token_counts[t], t))
    path = Path(folder) / DRAFT_VOCAB
    write_atomic(
        path,
        json.dumps({"ranked_token_ids": ranked, "counts": [token_counts[t] for t in ranked]})
        + "\n",
    )
    return path


def load_draft_vocab(folder: str | Path) -> list[int] | None:
    """The ranked token ids of a head folder, or None (upstream heads have none)."""
    try:
        return list(json.loads((Path(folder) / DRAFT_VOCAB).read_text())["ranked_token_ids"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class DraftProjection:
    """The target's frozen lm_head, over the whole vocabulary or over a draft vocabulary
    of frequent tokens (as EAGLE-3 does). On CPU the full projection is most of a drafting
    step's cost (49152 x 576 for SmolLM2: ~4 ms a row, the head's layer ~2 ms); rows of
    tokens the target rarely emits cost as much and are seldom right. Verification is
    unchanged, so a smaller draft vocabulary never changes the output, only speed."""

    def __init__(self, lm_head: nn.Linear, vocab: list[int] | None = None):
        self.vocab = vocab  # on the host too: a drafter maps its pick without a device read
        if vocab is None:
            self.linear, self.ids = lm_head, None
            return
        weight = lm_head.weight
        self.ids = torch.tensor(vocab, dtype=torch.long, device=weight.device)
        # token id -> draft index, -1 outside the draft vocabulary
        self._index = torch.full((weight.shape[0],), -1, dtype=torch.long, device=weight.device)
        self._index[self.ids] = torch.arange(len(vocab), device=weight.device)
        self.linear = nn.Linear(
            weight.shape[1], len(vocab), bias=False, device=weight.device, dtype=weight.dtype
        ).requires_grad_(False)
        self.linear.weight.copy_(weight.detach()[self.ids])

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., V'] over the draft vocabulary."""
        return layers.linear(hidden, self.linear)

    def tokens(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of draft-vocabulary indices."""
        return indices if self.ids is None else self.ids[indices]

    def token_of(self, index: int) -> int:
        """The token id of one draft-vocabulary index, on the host."""
        return index if self.vocab is None else self.vocab[index]

    def indices(self, tokens: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary index of each token id, -1 for ids outside it."""
        return tokens if self.ids is None else self._index[tokens]
