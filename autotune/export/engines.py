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

# The engines `autotune verify` runs on this machine (llama.cpp's server, built here, and
# transformers' generate); the others are measured only in autotune's engine.
VERIFIABLE = ("llamacpp", "hf")
