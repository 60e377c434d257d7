"""Where a method's heads come from when the user names none: autotune's heads cache
(what `heads train` or an earlier `profile` trained for this model's fingerprint), then
the local Hugging Face cache under the repository that published heads for the model
(read offline: autotune never downloads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import AutotuneError

# Published heads, by model alias and head kind (the repositories of the Medusa and EAGLE
# papers' Vicuna v1.3 heads).
UPSTREAM: dict[str, dict[str, str]] = {
    "vicuna-7b": {
        "medusa": "FasterDecoding/medusa-vicuna-7b-v1.3",
        "eagle": "yuhuili/EAGLE-Vicuna-7B-v1.3",
    },
    "vicuna-13b": {
        "medusa": "FasterDecoding/medusa-vicuna-13b-v1.3",
        "eagle": "yuhuili/EAGLE-Vicuna-13B-v1.3",
    },
    "vicuna-33b": {
        "medusa": "FasterDecoding/medusa-vicuna-33b-v1.3",
        "eagle": "yuhuili/EAGLE-Vicuna-33B-v1.3",
    },
}


@dataclass(frozen=True)
class FoundHeads:
    folder: Path
    source: str  # for people: where they were found


def find_heads(
    kind: str, model_name: str, model_fingerprint: str, check: Callable[[Path], None]
) -> FoundHeads | None:
    """The first usable heads of ``kind`` for the model, or None. ``check`` raises
    AutotuneError for a folder the method cannot load (it is passed over)."""
    from autotune.models.hub import find_in_hf_cache
    from autotune.training.job import cached_heads_folder

    candidates = [(cached_heads_folder(model_fingerprint, kind), "autotune's heads cache")]
    repo = UPSTREAM.get(model_name, {}).get(kind)
    if repo is not None:
        snapshot = find_in_hf_cache(repo)
        if snapshot is not None:
            candidates.append((snapshot, f"the Hugging Face cache ({repo})"))
    for folder, source in candidates:
        if not folder.is_dir():
            continue
        try:
            check(folder)
        except AutotuneError:
            continue  # damaged or of another shape: the next source, or training
        return FoundHeads(folder, source)
    return None
