"""The study database's URL (the default, the environment variable, checks, the URL with
its password hidden) and the error of two processes creating it at once. Imports no
Optuna."""

from __future__ import annotations

import os
from pathlib import Path

from autotune.errors import StorageError

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"
ENV_STORAGE = "AUTOTUNE_STORAGE"


def storage_url(url: str | None = None) -> str:
    return url or os.environ.get(ENV_STORAGE) or DEFAULT_STORAGE


def check_url(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(
            f"storage URL {url!r} is not a SQLAlchemy URL: use e.g. "
            f"{DEFAULT_STORAGE} or postgresql://user@host/db"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).expanduser().resolve().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the folder of the study database {folder}: "
                f"{exc.strerror}; pass --storage with a writable path"
            ) from None


def redact(url: str) -> str:
    """The URL with its password shown as ***."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL has no password to hide that we can find
        return "<storage URL>"


def created_meanwhile(exc: Exception) -> bool:
    """Another process created the same table a moment earlier (PostgreSQL: a unique
    violation in its catalogue, or "already exists"; SQLite: "already exists")."""
    from sqlalchemy.exc import IntegrityError

    return isinstance(exc, IntegrityError) or "already exists" in str(exc)
