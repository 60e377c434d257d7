"""Load a target model (weights + tokenizer) and wrap it as a `Target`."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from autotune import hardware
from autotune.cache_entry import CacheEntry
from autotune.errors import AutotuneError
from autotune.models import memory
from autotune.models.chat import encode_chat, encode_conversation, is_vicuna
from autotune.models.registry import ResolvedModel, fingerprint, resolve_model
from autotune.paths import cache_root

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# Config keys that say how a model was saved or loaded, not what it computes.
_VOLATILE_CONFIG_KEYS = {"transformers_version", "dtype", "torch_dtype"}


@dataclass
class Target:
    name: str
    path: str
    model: Any  # a LlamaForCausalLM-like causal LM, in eval mode
    tokenizer: Any
    fingerprint: str
    architecture: str
    dtype: str

    def encode_chat(self, user_text: str) -> list[int]:
        """Ids of `user_text` as one user turn in this model's chat format, before its reply."""
        return encode_chat(self.tokenizer, user_text, vicuna=is_vicuna(self.name, self.path))

    def encode_conversation(self, turns: list[str]) -> list[int]:
        """Ids of alternating user / assistant turns (user first and last), before the reply."""
        return encode_conversation(self.tokenizer, turns, vicuna=is_vicuna(self.name, self.path))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def converted_gguf_dir(model_fingerprint: str) -> Path:
    """Where the safetensors conversion of a GGUF with this fingerprint is cached: one per
    transformers major release (a tokenizer saved by transformers 5 names a class that 4
    does not have)."""
    import transformers

    major = transformers.__version__.split(".")[0]
    return cache_root() / "models" / f"{model_fingerprint}-transformers{major}"


def placement(dtype: str | torch.dtype, device: str) -> tuple[str, str]:
    """(dtype, device) resolved: ``auto`` chosen for this machine, spellings normalised,
    a GPU asked for and absent refused (``autotune.hardware``)."""
    device = hardware.resolve_device(device)
    return hardware.resolve_dtype(str(dtype), device), device


def _drop_quantizer(model: Any) -> None:
    # A GGUF-loaded model keeps a GGUF quantizer marker (though its weights are already
    # dequantised) and save_pretrained refuses it; without the marker it saves as plain
    # safetensors, and without quantization_config the saved config loads as plain too.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def converted_entry(resolved: ResolvedModel, model_fingerprint: str) -> CacheEntry:
    """The cache entry of a GGUF's safetensors conversion (``converted_gguf_dir``)."""
    return CacheEntry(
        converted_gguf_dir(model_fingerprint),
        f"the converted model {resolved.name}",
        folder=True,
    )


def _convert_gguf(resolved: ResolvedModel, into: Path) -> None:
    """Dequantise the GGUF (~30 s) and save it as safetensors in the folder ``into``."""
    log.info("converting %s to safetensors once; cached in autotune's cache", resolved.path)
    where, name = resolved.path.parent, resolved.path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except OSError as exc:  # the GGUF's failure, not the cache's (which would name it)
        raise AutotuneError(
            f"could not read {resolved.path} ({str(exc).strip().splitlines()[0]}): check it "
            "is a whole GGUF file"
        ) from None
    _drop_quantizer(model)
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)


def _load_tokenizer(folder: Path) -> Any:
    # LLaMA-1/Vicuna checkpoints ship only a SentencePiece tokenizer.model; transformers
    # needs the sentencepiece package to convert it, and fails obscurely without it.
    if (
        (folder / "tokenizer.model").is_file()
        and not (folder / "tokenizer.json").is_file()
        and importlib.util.find_spec("sentencepiece") is None
    ):
        raise AutotuneError(
            f"the tokenizer in {folder} is a SentencePiece tokenizer.model: "
            f"run `pip install sentencepiece` to load it"
        )
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _architecture(model: Any) -> str:
    archs = getattr(model.config, "architectures", None)
    return archs[0] if archs else type(model).__name__


def quiet_transformers() -> None:
    """autotune shows one progress display of its own: transformers' loading bars and
    advice (meant for its own users) would come between its lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_target(
    spec: str,
    model_path: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    tokens: int | None = None,
) -> Target:
    """Resolve `spec`, check it fits on the device (its KV cache sized for ``tokens``),
    load its weights and tokenizer locally (never downloads). ``dtype`` and ``device``
    may be ``auto``."""
    quiet_transformers()
    dtype_name, device = placement(dtype, device)
    resolved = resolve_model(spec, model_path)
    model_fingerprint = fingerprint(resolved)
    load = functools.partial(_load_weights, resolved.name, dtype_name, device, tokens)
    if resolved.kind == "gguf":
        entry = converted_entry(resolved, model_fingerprint)
        model, tokenizer = entry.obtain(lambda into: _convert_gguf(resolved, into), load)
    else:
        model, tokenizer = load(resolved.path)
    model.to(device).eval()
    return Target(
        name=resolved.name,
        path=str(resolved.path),
        model=model,
        tokenizer=tokenizer,
        fingerprint=model_fingerprint,
        architecture=_architecture(model),
        dtype=dtype_name,
    )


def _load_weights(
    name: str, dtype_name: str, device: str, tokens: int | None, folder: Path
) -> tuple[Any, Any]:
    """(model, tokenizer) from a model folder, checked to fit first."""
    from safetensors import SafetensorError

    model: Any
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        memory.check_fits(name, config, dtype_name, device, tokens)
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            dtype=DTYPES[dtype_name],
            attn_implementation="sdpa",
            local_files_only=True,
            # straight onto the GPU, tensor by tensor: the whole model never sits in RAM
            device_map=device if device.startswith("cuda") else None,
        )
        tokenizer = _load_tokenizer(folder)
    except (OSError, ValueError, SafetensorError) as e:
        lines = str(e).strip().splitlines()
        raise AutotuneError(
            f"could not load model '{name}' from {folder} "
            f"({lines[0] if lines else type(e).__name__}): "
            f"check it holds config.json, weights and tokenizer files"
        ) from e
    return model, tokenizer


def _in_memory_fingerprint(model: Any) -> str:
    config = {
        k: v
        for k, v in model.config.to_dict().items()
        if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS
    }
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}".encode())
        # A few leading values tell two random inits of one config apart, cheaply.
        sample = p.detach().reshape(-1)[:64].to("cpu", torch.float32)
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def target_from_model(model: Any, tokenizer: Any, name: str) -> Target:
    """Wrap an already-built model (e.g. a tiny random LLaMA in tests) as a Target."""
    model.eval()
    return Target(
        name=name,
        path=str(getattr(model.config, "_name_or_path", "") or ""),
        model=model,
        tokenizer=tokenizer,
        fingerprint=_in_memory_fingerprint(model),
        architecture=_architecture(model),
        dtype=str(model.dtype).removeprefix("torch."),
    )


def random_weights_model(
    spec: str, dtype: str = "float32", device: str = "cpu", tokens: int | None = None
) -> tuple[Any, str]:
    """(model, name): the architecture of ``spec`` with random weights and no tokenizer, for
    timing a device before the weights are on it. ``spec`` is an alias with registered
    shapes, or a model folder of which only config.json is read. Checked to fit first,
    its KV cache sized for ``tokens``."""
    from transformers import LlamaConfig

    from autotune.models.registry import ARCHITECTURES, read_config

    dtype_name, device = placement(dtype, device)
    if spec in ARCHITECTURES:
        config, name = LlamaConfig(**ARCHITECTURES[spec].llama_config()), spec
    elif (Path(spec).expanduser() / "config.json").is_file():
        folder = Path(spec).expanduser()
        read_config(folder)  # a broken file named by us, with what to do
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as e:
            lines = str(e).strip().splitlines()
            raise AutotuneError(
                f"cannot read {folder / 'config.json'}: {lines[0] if lines else type(e).__name__}"
            ) from None
        name = folder.name.lower()
    else:
        raise AutotuneError(
            f"--random-weights needs an alias whose shapes are known "
            f"({', '.join(ARCHITECTURES)}) or a model folder with config.json; '{spec}' is neither"
        )
    memory.check_fits(name, config, dtype_name, device, tokens)
    # Built in place on the device, in the dtype: a 13B model never exists in float32 on the CPU.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=DTYPES[dtype_name], attn_implementation="sdpa"
        )
    return model.eval(), name
