"""Where autotune keeps what it writes outside the working folder, and the one line that
says a place there cannot be used."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from autotune.errors import AutotuneError

CACHE_ENV = "AUTOTUNE_CACHE"


class CacheLocationError(AutotuneError):
    """A folder of autotune's cache cannot be made or written."""


def cache_root() -> Path:
    """Converted models, trained heads, logs: ``$AUTOTUNE_CACHE``, else under the XDG
    cache home (``$XDG_CACHE_HOME``, by default ``~/.cache``)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "autotune"


def cache_hint(exc: OSError | None = None) -> str:
    """What to do about a cache place that cannot be used: the variable that moves it
    (and, when the disk is full, freeing space)."""
    move = f"set {CACHE_ENV} to a folder autotune can write (now {cache_root()})"
    full = exc is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return f"free space there or {move}" if full else move


def cache_location_error(path: Path, exc: OSError, doing: str = "use") -> CacheLocationError:
    """``exc`` met while using ``path`` in the cache, as one line naming the place."""
    from autotune.files import reason

    return CacheLocationError(
        f"cannot {doing} {path} in autotune's cache: {reason(exc)}; {cache_hint(exc)}"
    )


def cache_folder(*parts: str) -> Path:
    """The folder ``parts`` under the cache root, made if missing; a CacheLocationError
    naming it and ``$AUTOTUNE_CACHE`` when it cannot be made or written (the root is a
    file, a parent cannot be created, no permission, a full disk)."""
    folder = cache_root().joinpath(*parts)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not folder.is_dir():  # mkdir's exist_ok passes a symlink to a file
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    except OSError as exc:
        raise cache_location_error(folder, exc, "create") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise cache_location_error(
            folder, PermissionError(errno.EACCES, "permission denied"), "write in"
        )
    return folder
