"""autotune's heads cache: the heads trained for a model, one folder per model fingerprint
and head kind, each a checked cache entry (``autotune.cache_entry``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from autotune.cache_entry import CacheEntry
from autotune.paths import cache_root


def heads_cache_root() -> Path:
    return cache_root() / "heads"


def heads_entry(model_fingerprint: str, kind: str) -> CacheEntry:
    """The cache entry of the ``kind`` heads trained for a model."""
    return CacheEntry(
        heads_cache_root() / model_fingerprint / kind,
        f"the cached {kind} heads of model {model_fingerprint}",
        folder=True,
    )


def entry_of(folder: Path) -> CacheEntry | None:
    """The heads cache entry that ``folder`` is, or None for a folder of the user's."""
    try:
        inside = Path(folder).resolve().relative_to(heads_cache_root().resolve())
    except (ValueError, OSError):
        return None
    return heads_entry(*inside.parts) if len(inside.parts) == 2 else None


@contextlib.contextmanager
def loading_heads(folder: Path, kind: str) -> Iterator[None]:
    """Around a load of heads: cached heads that fail to load and are not as they were
    written are moved aside (said in one line), so that the next run trains new ones."""
    entry = entry_of(folder)
    if entry is None:
        yield
        return
    with entry.reading(
        f"train new ones with `autotune heads train --kind {kind}` (or a profile run)"
    ):
        yield
