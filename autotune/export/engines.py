"""The serving engines autotune exports to, by their command-line name. Which methods
each serves is said by the methods themselves (``Method.exporters``)."""

from __future__ import annotations

ENGINES: dict[str, str] = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "trtllm": "TensorRT-LLM",
    "hf": "transformers",
    "llamacpp": "llama.cpp",
    "dv": "Draft & Verify",
}
