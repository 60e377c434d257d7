"""Target models: aliases, local resolution (never downloads), loading, chat formatting."""

from autotune.models.chat import encode_chat, is_vicuna, vicuna_prompt
from autotune.models.loading import (
    Target,
    cache_root,
    converted_gguf_dir,
    load_target,
    random_weights_model,
    target_from_model,
)
from autotune.models.registry import (
    ALIASES,
    ARCHITECTURES,
    ResolvedModel,
    fingerprint,
    hf_hub_cache,
    list_models,
    resolve_model,
)

__all__ = [
    "ALIASES",
    "ARCHITECTURES",
    "ResolvedModel",
    "Target",
    "cache_root",
    "converted_gguf_dir",
    "encode_chat",
    "fingerprint",
    "hf_hub_cache",
    "is_vicuna",
    "list_models",
    "load_target",
    "random_weights_model",
    "resolve_model",
    "target_from_model",
    "vicuna_prompt",
]
