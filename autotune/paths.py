"""Where autotune keeps what it writes outside the working folder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Converted models, trained heads, logs: ``$AUTOTUNE_CACHE``, else under the XDG
    cache home (``$XDG_CACHE_HOME``, by default ``~/.cache``)."""
    explicit = os.environ.get("AUTOTUNE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "autotune"
