"""The command that serves a written export: the last step from a profile to a server.

`autotune export PROFILE --engine E --out FILE` ends with this line, so that a user goes
from the export to a running server without reading the engine's documentation. The model
is named as the engine takes it: the profile's Hugging Face repo id where known (or the
alias's), else ``MODEL``; llama.cpp takes a GGUF file, ``MODEL.gguf``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from autotune.export.base import Export
from autotune.models.registry import ALIASES

# A flags export's comment that already says what to append its flags to (llama.cpp's
# draft-model exports name the draft GGUF there).
APPEND_TO = "# note: append these flags to: "


def serving_model(model) -> str:
    """How an engine names the profile's model: its repo id, the alias's, or MODEL."""
    return model.repo or ALIASES.get(model.name) or "MODEL"


def serve_command(export: Export, model: str, out: Path) -> str | None:
    """The shell command that serves ``export`` written at ``out``; None for an engine
    that is a library, not a server (transformers)."""
    file = shlex.quote(str(out))
    if export.engine == "vllm":
        config = yaml.safe_load(export.text)["speculative_config"]
        return f"vllm serve {model} --speculative-config {shlex.quote(json.dumps(config))}"
    if export.engine == "trtllm":
        return f"trtllm-serve {model} --extra_llm_api_options {file}"
    if export.engine == "sglang":
        flags = _flags(export.text)
        return f"python -m sglang.launch_server --model-path {model} {flags}"
    if export.engine == "llamacpp":
        notes = [line for line in export.text.splitlines() if line.startswith(APPEND_TO)]
        base = notes[0].removeprefix(APPEND_TO) if notes else "llama-server -m MODEL.gguf"
        return f"{base} {_flags(export.text)}"
    return None


def _flags(text: str) -> str:
    """A flags file's flags on one line: comments and line continuations dropped."""
    lines = (line.strip().removesuffix("\\").strip() for line in text.splitlines())
    return " ".join(line for line in lines if line and not line.startswith("#"))
