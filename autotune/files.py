"""Writing a file whole or not at all, and saying in one line why it could not be.

Every file autotune writes for the user (profiles, exports, plots, head configs) goes
through ``atomic_path``: the content is written to a temporary name beside the target
and renamed onto it only when complete, so a full disk, a killed run or a read-only
folder never leaves a 0-byte or half-written file. An ``OSError`` on the way becomes an
``OutputPathError`` naming the file, the reason and ``hint`` (what to do).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import OutputPathError

DEFAULT_HINT = "choose another --out"

# The reasons a user can act on, in words; any other errno keeps the system's own words.
_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOENT: "no such file or folder, or one that cannot hold files",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder; give a file name",
    errno.EEXIST: "a file of that name is in the way",
    errno.ENAMETOOLONG: "the name is too long",
}


def reason(exc: OSError) -> str:
    """An OSError in a few words, without the path (the caller names it)."""
    words = _REASONS.get(exc.errno or 0) or exc.strerror
    if words:
        return words[0].lower() + words[1:]
    return str(exc) or type(exc).__name__


def write_error(path: Path, exc: OSError, hint: str = DEFAULT_HINT) -> OutputPathError:
    return OutputPathError(f"cannot write {path}: {reason(exc)}; {hint}")


@contextlib.contextmanager
def atomic_path(path: Path, hint: str = DEFAULT_HINT) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to (it keeps ``path``'s suffix, for
    writers that choose the format by it); renamed onto ``path`` when the block ends
    without an exception, removed on any failure. The folder is made if missing."""
    path = Path(path)
    made = _make_folder(path.parent, hint)
    try:
        temp = _new_temp(path)
    except OSError as exc:
        _remove_folders(made)
        raise write_error(path, exc, hint) from None
    try:
        yield temp
        os.replace(temp, path)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        _remove_folders(made)
        if isinstance(exc, OSError):
            raise write_error(path, exc, hint) from None
        raise


def write_atomic(path: Path, content: str | bytes, hint: str = DEFAULT_HINT) -> None:
    """``content`` (text as UTF-8) in ``path``, whole or not at all."""
    data = content.encode() if isinstance(content, str) else content
    with atomic_path(path, hint) as temp:
        _write_synced(temp, data)


def _write_synced(path: Path, data: bytes) -> None:
    """All of ``data`` into the (empty) file ``path``, on the disk when this returns: a
    full disk may say so only when the data is flushed."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable(path: Path, hint: str = DEFAULT_HINT) -> None:
    """Fail now, before any long work, if ``path`` could not be written: a byte is
    written to a temporary file in its folder, which is then removed, with any folders
    made for it."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"cannot write {path}: it is a folder, not a file name; {hint}")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write {path}: permission denied; {hint}")
    made = _make_folder(path.parent, hint)
    temp = None
    try:
        temp = _new_temp(path)
        _write_synced(temp, b"\n")  # a full disk may make a file, but refuses a byte
    except OSError as exc:
        raise write_error(path, exc, hint) from None
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)
        _remove_folders(made)


def _new_temp(path: Path) -> Path:
    """An empty file of a new name beside ``path``, keeping its suffix; made with the
    mode a plain ``open`` gives (the umask applies), unlike ``tempfile``'s 0600."""
    for _ in range(100):
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")
        try:
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


def _make_folder(folder: Path, hint: str) -> list[Path]:
    """Make ``folder`` and its missing parents; the ones made, deepest first."""
    missing = []
    current = folder
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_folders(missing)
        raise OutputPathError(f"cannot create the folder {folder}: {reason(exc)}; {hint}") from None
    return missing


def _remove_folders(folders: list[Path]) -> None:
    for folder in folders:  # deepest first; one holding something else stays
        with contextlib.suppress(OSError):
            folder.rmdir()
