"""The GLIDE draft model: a small LLaMA-style decoder whose layers also attend to the
target's KV cache, and its two checkpoint layouts.

A draft layer runs self-attention over the draft's own tokens, then cross-attention
whose keys and values are the target's cached keys and values of one target layer
(draft layer m of N_D reads target layer N_T - N_D + m), then the MLP. Only the cross
query and output projections are learned: the cached keys are already rotated, so the
query is rotated at its own position with the target's rotary embedding (its
``rope_theta`` read from the target's config), and grouped-query attention repeats the
target's KV heads. The draft predicts the token after each of its inputs.

Layouts:
- ours (``autotune heads train --kind glide``): ``config.json`` (the draft decoder's
  LlamaConfig, plus a ``glide`` entry: the target layers read, the target it was made
  for, and whether the embedding and lm_head are the target's) and ``model.safetensors``
  with ``layers.{m}.{input_layernorm, self_attn.{q,k,v,o}_proj, cross_norm,
  cross_attn.{q,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``norm``
  (and ``embed_tokens``, ``lm_head`` when the draft has a vocabulary of its own). Ours
  norms the cross-attention's input (``cross_norm``); the reference does not.
- the reference's (NonvolatileMemory/GliDe_with_a_CaPE_ICML_24, ``smallLlamaForCausalLM``
  saved by ``save_pretrained``, e.g. ``cxdu/glide47m-vicuna7b``): ``config.json`` (its
  smallLlamaConfig) and ``model.safetensors`` or ``pytorch_model.bin`` with the names of
  ``UPSTREAM_NAMES``: its own embedding and lm_head, no cross-attention norm.
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
from autotune.engine.runner import Runner, visibility
from autotune.heads.cache import loading_heads
from autotune.heads.medusa import HeadsError, read_weights, write_heads_folder

CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
LAYOUT_KEY = "glide"  # config.json's entry that marks our layout
TRAIN_COMMAND = "`autotune heads train --kind glide`"

# The reference's parameter names (smallLlamaForCausalLM's state dict) -> ours. Within a
# layer the names are the same (input_layernorm, self_attn.*, cross_attn.q_proj / o_proj,
# post_attention_layernorm, mlp.*); the reference has no cross_norm.
UPSTREAM_NAMES = {
    "model.embed_tokens.": "embed_tokens.",
    "model.layers.": "layers.",
    "model.norm.": "norm.",
    "lm_head.": "lm_head.",
}
# ColossalAI's GLIDE variant re-projects the cached keys and values: not the reference.
_REMAP = ("cross_attn.remap_k", "cross_attn.remap_v")


@dataclass(frozen=True)
class GlideSpec:
    """What the draft's decoder config does not say."""

    target_layers: tuple[int, ...]  # the target layer each draft layer reads
    cross_norm: bool = True  # an RMSNorm before the cross-attention (ours; not the reference)
    own_vocab: bool = False  # its own embedding and lm_head (the reference's), else the target's


def rope_theta(config) -> float:
    """The RoPE base of a transformers config (5.x keeps it in ``rope_parameters``)."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(config, "rope_theta", 10000.0))


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def default_target_layers(target_layers: int, draft_layers: int) -> tuple[int, ...]:
    """The reference's choice: draft layer m reads target layer N_T - N_D + m."""
    return tuple(max(0, target_layers - draft_layers + m) for m in range(draft_layers))


class CrossAttention(nn.Module):
    """Query and output projections over the target's attention heads."""

    def __init__(self, hidden: int, target_heads: int, target_head_dim: int):
        super().__init__()
        self.head_dim = target_head_dim
        self.q_proj = nn.Linear(hidden, target_heads * target_head_dim, bias=False)
        self.o_proj = nn.Linear(target_heads * target_head_dim, hidden, bias=False)


def cross_attention(
    attention: CrossAttention,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """x [B, S, H] (already normed, if the layer norms it) attends to the target's cached
    keys/values [B, kv_heads, T, D] (keys rotated at their positions); the query is
    rotated at its own position by ``rope``, the target's rotary embedding."""
    return segmented_cross_attention(
        attention, x, [CrossSegment(x.shape[1], rope, keys, values, mask)]
    )


@dataclass
class CrossSegment:
    """One sequence's rows in a cross-attention over a batch: their rotation and the
    target cache (and its visibility) they read."""

    rows: int
    rope: tuple[torch.Tensor, torch.Tensor]
    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None


def segmented_cross_attention(
    attention: CrossAttention, x: torch.Tensor, segments: list[CrossSegment]
) -> torch.Tensor:
    """``cross_attention`` over x [B, S, H] holding several sequences' rows, one segment
    after another: the projections run once over all of them, each segment attends to
    its own target cache."""
    dim = attention.head_dim
    queries = layers.heads_of(layers.linear(x, attention.q_proj), dim)
    parts, start = [], 0
    for segment in segments:
        end = start + segment.rows
        query = layers.Rotation(segment.rope)(queries[:, :, start:end])
        parts.append(layers.attend(query, segment.keys, segment.values, segment.mask, dim**-0.5))
        start = end
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return layers.linear(out, attention.o_proj)


class GlideLayer(nn.Module):
    def __init__(self, config, target_config, index: int, cross_norm: bool):
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.self_attn = LlamaAttention(config, layer_idx=index)
        self.cross_norm: nn.Module = LlamaRMSNorm(hidden, eps=eps) if cross_norm else nn.Identity()
        self.cross_attn = CrossAttention(
            hidden, target_config.num_attention_heads, head_dim_of(target_config)
        )
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.mlp = LlamaMLP(config)


TargetKV = list[tuple[torch.Tensor, torch.Tensor]]  # per draft layer: keys, values [B, kv, T, D]


class GlideDraft(nn.Module):
    def __init__(self, config, target_config, spec: GlideSpec):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        if getattr(config, "_attn_implementation", None) in (None, "flash_attention_2"):
            config._attn_implementation = "sdpa"  # a bare module: nothing else picks one
        if len(spec.target_layers) != config.num_hidden_layers:
            raise ValueError("one target layer per draft layer")
        self.config, self.spec = config, spec
        self.target_config = copy.deepcopy(target_config)
        self.layers = nn.ModuleList(
            GlideLayer(config, target_config, m, spec.cross_norm)
            for m in range(config.num_hidden_layers)
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)
        # the cached keys were rotated by the target: the cross query must be too, with the
        # target's own base and head size (the reference hard-codes base 10000 here)
        self.cross_rotary = LlamaRotaryEmbedding(self.target_config)
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: nn.Linear | None = None
        if spec.own_vocab:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.spec.target_layers

    def vocabulary(self, runner: Runner) -> tuple[Any, nn.Linear]:
        """(embedding, lm_head) the draft reads and writes tokens with: its own, or the
        target's frozen ones."""
        if self.embed_tokens is not None and self.lm_head is not None:
            return self.embed_tokens, self.lm_head
        return runner.embed, runner.lm_head

    def new_cache(self, capacity: int = 512) -> KVCache:
        weight = self.norm.weight
        return KVCache.for_config(
            self.config, len(self.layers), weight.dtype, weight.device, capacity
        )

    def read_target(self, cache: KVCache, length: int) -> TargetKV:
        """The target layers' cached keys and values at positions 0 .. length - 1 (views)."""
        return [
            (cache.keys[t][:, :, :length], cache.values[t][:, :, :length])
            for t in self.target_layers
        ]

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        target_kv: TargetKV,
        cross_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The final-normed hidden states [B, S, H] for inputs ``embeds`` [B, S, H] at
        ``positions`` [B, S] (or [1, S]).

        cross_mask: bool (True = may attend), broadcastable to [B, heads, S, T] over the
        target's T cached positions; None: all of them. With ``cache`` (B = 1), the draft's
        own keys/values are appended to it and ``mask`` is a bool mask as ``Runner.forward``
        takes it ([S, S] or [S, P + S], None = causal); without it, ``mask`` is a bool
        mask [B, 1, S, S] (None = causal).
        """
        if cache is not None:
            rows = GlideRows(embeds[0], positions.reshape(-1), target_kv, cache, cross_mask, mask)
            return self.forward_rows([rows])[None]
        seq = embeds.shape[1]
        positions = positions.expand(embeds.shape[0], -1)
        rope = self.rotary(embeds, positions)
        cross_rope = self.cross_rotary(embeds, positions)
        if mask is None and seq > 1:
            mask = torch.ones(seq, seq, dtype=torch.bool, device=embeds.device).tril()
        own = [layers.AttentionSegment(seq, rope, mask)]
        cross = [
            [CrossSegment(seq, cross_rope, keys, values, cross_mask)] for keys, values in target_kv
        ]
        return self.decoder_layers(embeds, own, cross)

    def forward_rows(self, sequences: list[GlideRows]) -> torch.Tensor:
        """The final-normed hidden states [N, H] of several sequences' rows, one after
        another: each reads its own target cache and its own draft cache (appended to);
        the products run once over all N rows."""
        hidden = torch.cat([s.embeds for s in sequences])[None]
        # made on the host where the draft has a step (``Runner.input_device``)
        positions = torch.cat([s.positions for s in sequences])[None].to(hidden.device)
        cos, sin = self.rotary(hidden, positions)
        cross_cos, cross_sin = self.cross_rotary(hidden, positions)
        own: list[layers.AttentionSegment] = []
        cross: list[list[CrossSegment]] = [[] for _ in self.layers]
        start = 0
        for s in sequences:
            count, end = s.positions.shape[0], start + s.positions.shape[0]
            rope = (cos[:, start:end], sin[:, start:end])
            mask = visibility(s.mask, s.cache.length(0), count, hidden.device)
            own.append(layers.AttentionSegment(count, rope, mask, s.cache))
            cross_rope = (cross_cos[:, start:end], cross_sin[:, start:end])
            seen = s.cross_mask
            if seen is not None:
                seen = seen.reshape(1, 1, count, -1).to(hidden.device)
            for index, (keys, values) in enumerate(s.target_kv):
                cross[index].append(CrossSegment(count, cross_rope, keys, values, seen))
            start = end
        return self.decoder_layers(hidden, own, cross)[0]

    def decoder_layers(
        self,
        hidden: torch.Tensor,
        own: list[layers.AttentionSegment],
        cross: list[list[CrossSegment]],
    ) -> torch.Tensor:
        """The draft layers over ``hidden`` [B, S, H], then the final norm: self-attention
        per segment of ``own``, and draft layer m's cross-attention per segment of
        ``cross[m]`` (what a fixed-shape step runs too, ``heads.static_glide``)."""
        for index, reads in enumerate(cross):
            layer: Any = self.layers[index]  # submodules named by convention
            hidden = hidden + layers.segmented_attention(
                layer.self_attn, layer.input_layernorm(hidden), own, index
            )
            hidden = hidden + segmented_cross_attention(
                layer.cross_attn, layer.cross_norm(hidden), reads
            )
            hidden = hidden + layers.mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        return self.norm(hidden)


@dataclass
class GlideRows:
    """One sequence's rows for the draft: input embeddings [S, H] at ``positions`` [S],
    the target cache they read (``cross_mask`` [S, T] or None: all of it), their own
    cache (appended to) and ``mask`` as ``Runner.forward`` takes it. ``target``: the
    target's cache that ``target_kv`` was read from (its first T entries), where the
    caller has it: a fixed-shape step reads that cache's storage in place."""

    embeds: torch.Tensor
    positions: torch.Tensor
    target_kv: TargetKV
    cache: KVCache
    cross_mask: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    target: KVCache | None = None


# --- what the draft sees of the target's cache ----------------------------------------


def stale_visibility(limits: torch.Tensor, keys: int) -> torch.Tensor:
    """bool [S, keys]: row i sees the target's positions below limits[i], and always
    position 0 (so no row sees nothing: at inference the root's cache holds at least the
    prompt's first token)."""
    columns = torch.arange(keys, device=limits.device)
    return (columns[None] < limits[:, None]) | (columns[None] == 0)


def block_limits(length: int, block: int, shift: int = 0) -> torch.Tensor:
    """[length]: GLIDE's training view of the target's cache. Positions fall in blocks of
    ``block`` (the first starting at -shift); each sees the target's cache below its
    block's start, as the k-th draft step from a root at that start sees it (stale by
    k + 1 tokens). The reference aligns blocks at 0 (shift 0)."""
    positions = torch.arange(length)
    return positions - (positions + shift) % block


@torch.inference_mode()
def teacher_cache(runner: Runner, tokens: list[int], logits: bool = False):
    """One frozen teacher-forced forward of the target over ``tokens``: its KV cache (and
    its logits [n, V] when asked), what the draft reads at every position."""
    device = runner.device
    cache = runner.new_cache(capacity=len(tokens) + 8, own=True)  # kept: not a lane
    out = runner.forward(
        torch.tensor(tokens, device=device),
        torch.arange(len(tokens), device=device),
        cache,
        last_only=not logits,
    )
    return (cache, out.logits) if logits else cache


# --- building, saving, loading --------------------------------------------------------


def draft_config(target_config, num_layers: int):
    """The draft decoder's config: the target's (its hidden size, heads, MLP and RoPE),
    with ``num_layers`` layers."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = num_layers
    config.tie_word_embeddings = False
    return config


def new_glide_draft(target_config, num_layers: int, cross_norm: bool = True) -> GlideDraft:
    """A randomly initialised draft sharing the target's embedding and lm_head, reading the
    reference's choice of target layers."""
    spec = GlideSpec(
        default_target_layers(target_config.num_hidden_layers, num_layers), cross_norm, False
    )
    return GlideDraft(draft_config(target_config, num_layers), target_config, spec)


def _target_record(config) -> dict:
    return {
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": head_dim_of(config),
        "vocab_size": config.vocab_size,
        "rope_theta": rope_theta(config),
    }


def save_glide_draft(
    draft: GlideDraft, folder: str | Path, base_model: str, extra: dict | None = None
) -> Path:
    """Write our layout (the target's embedding and lm_head are not stored when shared)."""
    config = draft.config.to_dict()
    config.update(
        {
            "architectures": ["GlideDraft"],
            "num_hidden_layers": len(draft.layers),
            "base_model_name_or_path": base_model,
            LAYOUT_KEY: {
                "layout": "autotune",
                "target_layers": list(draft.target_layers),
                "cross_norm": draft.spec.cross_norm,
                "own_vocab": draft.spec.own_vocab,
                "target": _target_record(draft.target_config),
            },
            **(extra or {}),
        }
    )
    return write_heads_folder(folder, WEIGHTS[0], draft.state_dict(), config)


def is_glide_folder(folder: Path) -> bool:
    return (folder / CONFIG).is_file() and (
        any((folder / w).is_file() for w in WEIGHTS)
        or any((folder / i).is_file() for i in SHARD_INDEXES)
    )


def _read_config(folder: Path) -> dict:
    try:
        raw = json.loads((folder / CONFIG).read_text())
    except OSError:
        raise HeadsError(
            f"no {CONFIG} in {folder}: a GLIDE draft folder needs one; train a draft "
            f"with {TRAIN_COMMAND}"
        ) from None
    except ValueError as exc:
        raise HeadsError(f"{folder / CONFIG} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise HeadsError(f"{folder / CONFIG} is not a JSON object")
    return raw


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    for index in SHARD_INDEXES:  # a sharded save_pretrained: read every shard
        if (folder / index).is_file():
            shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(read_weights(folder, (shard,), "GLIDE", f"{index} names it"))
            return state
    return read_weights(
        folder,
        WEIGHTS,
        "GLIDE",
        f"pass a GLIDE draft folder (config.json + model.safetensors or "
        f"pytorch_model.bin), or train one with {TRAIN_COMMAND}",
    )


def _llama_config(raw: dict):
    from transformers import LlamaConfig

    # the reference's own keys (block_size, large_*, use_remap) and ours are not LLaMA's
    dropped = {LAYOUT_KEY, "autotune", "architectures", "auto_map", "model_type"}
    reference = {"block_size", "large_hidden_size", "large_head_dim"}
    reference |= {"large_num_attention_heads", "use_remap"}
    return LlamaConfig(**{k: v for k, v in raw.items() if k not in dropped | reference})


def upstream_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference's state dict under our names (``UPSTREAM_NAMES``)."""
    out = {}
    for key, value in state.items():
        for prefix, ours in UPSTREAM_NAMES.items():
            if key.startswith(prefix):
                out[ours + key[len(prefix) :]] = value
                break
    return out


def _count_layers(state: dict[str, torch.Tensor], folder: Path) -> int:
    found = {int(k.split(".")[1]) for k in state if k.startswith("layers.")}
    if not found:
        raise HeadsError(f"{folder}: no draft layer weights ('layers.0.*'): not a GLIDE draft")
    return max(found) + 1


def _check_fits(folder: Path, config, spec: GlideSpec, target_config, raw: dict) -> None:
    """Fail with a one-line HeadsError unless the draft reads this target's cache."""
    retrain = f"train a draft for this model with {TRAIN_COMMAND}"
    if config.vocab_size != target_config.vocab_size:
        raise HeadsError(
            f"the GLIDE draft in {folder} has a vocabulary of {config.vocab_size} tokens, "
            f"the model {target_config.vocab_size}: {retrain}"
        )
    if not spec.own_vocab and config.hidden_size != target_config.hidden_size:
        raise HeadsError(
            f"the GLIDE draft in {folder} shares the target's embedding but has hidden "
            f"size {config.hidden_size}, the model {target_config.hidden_size}: {retrain}"
        )
    if max(spec.target_layers) >= target_config.num_hidden_layers:
        raise HeadsError(
            f"the GLIDE draft in {folder} reads target layer {max(spec.target_layers)}; "
            f"the model has {target_config.num_hidden_layers}: {retrain}"
        )
    made_for = raw.get(LAYOUT_KEY, {}).get("target")
    if made_for:
        now = _target_record(target_config)
        differs = sorted(k for k, v in made_for.items() if k in now and now[k] != v)
        if differs:
            raise HeadsError(
                f"the GLIDE draft in {folder} was made for a model with "
                + ", ".join(f"{k} {made_for[k]}" for k in differs)
                + f"; this one has {', '.join(f'{k} {now[k]}' for k in differs)}: {retrain}"
            )


def _spec(raw: dict, layers_count: int, target_config) -> GlideSpec:
    ours = raw.get(LAYOUT_KEY)
    if isinstance(ours, dict) and ours.get("layout") == "autotune":
        return GlideSpec(
            tuple(int(t) for t in ours["target_layers"]),
            bool(ours.get("cross_norm", True)),
            bool(ours.get("own_vocab", False)),
        )
    return GlideSpec(
        default_target_layers(target_config.num_hidden_layers, layers_count),
        cross_norm=False,
        own_vocab=True,
    )


def load_glide_draft(
    folder: str | Path,
    target_config,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> GlideDraft:
    """Load a draft in our layout or the reference's and check it fits the target. The
    layer count comes from the weights; the cross-attention's RoPE from the target."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise HeadsError(f"GLIDE draft folder {folder} not found")
    with loading_heads(folder, "glide"):
        raw = _read_config(folder)
        state = _read_state(folder)
        if any(k.startswith("model.layers.") for k in state):
            state = upstream_state(state)
        if any(r in k for k in state for r in _REMAP):
            raise HeadsError(
                f"{folder}: cross_attn.remap_k / remap_v are ColossalAI's GLIDE variant, not "
                "the reference's layout: use a reference checkpoint or train one with "
                f"{TRAIN_COMMAND}"
            )
        count = _count_layers(state, folder)
        config = _llama_config(raw)
        config.num_hidden_layers = count
        spec = _spec(raw, count, target_config)
        _check_fits(folder, config, spec, target_config, raw)
        query = state.get("layers.0.cross_attn.q_proj.weight")
        wanted = target_config.num_attention_heads * head_dim_of(target_config)
        if query is None or query.shape != (wanted, config.hidden_size):
            shape = None if query is None else list(query.shape)
            raise HeadsError(
                f"{folder}: layers.0.cross_attn.q_proj.weight is {shape}; reading this model's "
                f"cache needs [{wanted}, {config.hidden_size}]: train a draft for this model "
                f"with {TRAIN_COMMAND}"
            )
        draft = GlideDraft(config, target_config, spec)
        expected = set(draft.state_dict())
        missing = expected - state.keys()
        if missing:
            raise HeadsError(f"{folder}: weights missing for {sorted(missing)[:4]}")
        draft.load_state_dict({k: state[k] for k in expected})
        return draft.to(dtype=dtype, device=device).eval().requires_grad_(False)
