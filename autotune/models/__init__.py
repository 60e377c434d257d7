"""Target models: aliases, local resolution (never downloads), loading, chat formatting."""

from autotune.models.chat import encode_chat, is_vicuna, vicuna_prompt
from autotune.models.loading import (
    Target,
    cache_root,
    converted_gguf_dir,
    load_target,
    target_from_model,
)
from autotune.models.registry import (
    ALIASES,
    ResolvedModel,
    fingerprint,
    hf_hub_cache,
    list_models,
    resolve_model,
)

__all__ = [
    "ALIASES",
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
    "resolve_model",
    "target_from_model",
    "vicuna_prompt",
]
