"""The one engine release each exporter writes for. Its option names were checked against
that release's own source: ``tests/data/engines/<engine>.json`` lists them, regenerated
from a source checkout by ``scripts/engine_options.py``, and every exporter's test checks
each key it writes against that list. The stored sources of vLLM, SGLang and TensorRT-LLM
name a commit of their main branch, not a tag; llama.cpp is the tree built here
(``serving.llamacpp``); transformers is the release installed beside autotune, whose own
``generate`` the tests run with the exports.
"""

from __future__ import annotations

import importlib.metadata

from autotune.serving.llamacpp import RELEASE as LLAMACPP

VLLM = "vLLM main at 002e77c1f (vllm/config/speculative.py)"
SGLANG = "SGLang main at 015c87262 (python/sglang/srt/arg_groups/fields/spec.py)"
TRTLLM = "TensorRT-LLM main at 000439672 (tensorrt_llm/llmapi/llm_args.py)"


def transformers() -> str:
    try:
        return f"transformers {importlib.metadata.version('transformers')}"
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (a dependency)
        return "transformers (not installed)"


__all__ = ["LLAMACPP", "SGLANG", "TRTLLM", "VLLM", "transformers"]
