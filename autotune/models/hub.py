"""The local Hugging Face hub cache: where it is, and what it holds of a repo. Nothing here
touches the network: a repo that is not in the cache is simply not found.

The layout (huggingface_hub's): ``<cache>/models--<org>--<name>/snapshots/<revision>/``
holds a revision's files (links into ``blobs/``), and ``refs/main`` names the revision
the main branch pointed at when it was downloaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# An "org/name" repo id as the Hub allows it (letters, digits, '-', '_', '.').
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
_PREFIX = "models--"


def hub_cache() -> Path:
    """The hub cache, found as huggingface_hub finds it (``HF_HUB_CACHE``, the older
    ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``/hub, ``XDG_CACHE_HOME``/huggingface/hub,
    ~/.cache/huggingface/hub), read at call time rather than at import."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return _path(os.environ[variable])
    if os.environ.get("HF_HOME"):
        return _path(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (_path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _path(value: str) -> Path:
    return Path(os.path.expandvars(value)).expanduser()


def is_repo_id(text: str) -> bool:
    """``org/name`` as the Hub spells repo ids (a path such as ``./x`` or ``a/b/c`` is not)."""
    return _REPO_ID.fullmatch(text) is not None and ".." not in text


def repo_folder(repo_id: str) -> Path:
    """Where the cache keeps ``repo_id`` (whether or not it is there)."""
    return hub_cache() / (_PREFIX + repo_id.replace("/", "--"))


def repo_of(folder: Path) -> str | None:
    """The repo id of a snapshot folder inside a hub cache, else None."""
    parts = Path(folder).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(_PREFIX):
            org, _, name = parts[i - 1][len(_PREFIX) :].partition("--")
            return f"{org}/{name}" if name else None
    return None


def snapshot_in(repo_dir: Path, needs: str = "config.json") -> Path | None:
    """The snapshot of a cached repo that holds ``needs``: the revision ``refs/main`` names,
    else the newest (a download of another branch, or a cache copied without refs)."""
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip()
        if (candidate / needs).is_file():
            return candidate
    if not snapshots.is_dir():
        return None
    found = [d for d in snapshots.iterdir() if (d / needs).is_file()]
    return max(found, key=lambda d: d.stat().st_mtime) if found else None


def find_in_hf_cache(repo_id: str, needs: str = "config.json") -> Path | None:
    """The local snapshot folder of ``repo_id`` (a model, or Medusa / EAGLE heads) holding
    ``needs``, or None when it was never downloaded here. Never downloads."""
    if not is_repo_id(repo_id):
        return None
    return snapshot_in(repo_folder(repo_id), needs)


def download_hint(repo_id: str) -> str:
    """What to run to fetch a repo: autotune itself never downloads."""
    return f"`huggingface-cli download {repo_id}`"
