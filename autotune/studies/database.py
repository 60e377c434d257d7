"""The study database's URL (the default, the environment variable, checks, the URL with
its password hidden) and the error of two processes creating it at once. Imports no
Optuna."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
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


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None: another database, or SQLite in memory)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser().resolve()


# SQLite's own files beside a database: a rollback journal, or write-ahead log and index
SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")


@contextlib.contextmanager
def undone_if_failed(url: str) -> Iterator[None]:
    """Opening (and creating) a study database leaves nothing behind when it fails: a
    SQLite file that was not there before, its journal and the folders made for it are
    removed again (a full disk, say, leaves a 0-byte database otherwise)."""
    path = sqlite_file(url)
    if path is None or path.exists():
        yield
        return
    folders = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folders.append(folder)
        folder = folder.parent
    try:
        yield
    except BaseException:
        for name in ("", *SQLITE_SIDE_FILES):
            with contextlib.suppress(OSError):
                Path(f"{path}{name}").unlink(missing_ok=True)
        for made in folders:  # deepest first; one holding something else stays
            with contextlib.suppress(OSError):
                made.rmdir()
        raise


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
