"""What autotune keeps between runs, written whole and checked when read back.

An entry is one file (answers, a kernel table) or one folder (a converted model, trained
heads) in autotune's cache. It is written under a temporary name beside its place and
renamed there only when complete, with a record of each file's size and sha256: inside a
folder entry (``.autotune-entry.json``), beside a file entry (``<name>.record``).

Reading an entry checks every recorded file's size, and its hash when the file is small
enough to hash at once (``HASH_LIMIT``); a larger safetensors file is checked by its own
header (its tensors must end where the file ends). When a load fails all the same, every
hash is checked: an entry that is not what was written is broken, one that is was not the
cause. A broken entry is said in one line on stderr, moved aside to
``<name>.broken-<time>`` and rebuilt by the caller, never read as if whole. An entry
written before records were kept is used if it loads (and recorded then).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import secrets
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from autotune.errors import AutotuneError, OutputPathError
from autotune.paths import cache_location_error
from autotune.progress import console

SCHEMA = "autotune/cache-entry@1"
FOLDER_RECORD = ".autotune-entry.json"
FILE_RECORD_SUFFIX = ".record"
# Files up to this size are hashed on every read: sha256 ran at 1.7 GB/s on this project's
# 2-core machine, 0.3 s for SmolLM2-135M's converted 540 MB, beside seconds of loading it.
# Larger ones are checked by size and header, and hashed after a failed load only.
HASH_LIMIT = 2**30
_CHUNK = 4 * 2**20
STALE_STAGED_S = 24 * 3600.0  # converting a large GGUF takes minutes, not a day

T = TypeVar("T")


@dataclass(frozen=True)
class CacheEntry:
    """One thing in the cache: ``path`` (a folder when ``folder``), ``what`` it is in
    words for the user ("the converted model smollm2-135m")."""

    path: Path
    what: str
    folder: bool = False

    @property
    def record_path(self) -> Path:
        if self.folder:
            return self.path / FOLDER_RECORD
        return self.path.with_name(self.path.name + FILE_RECORD_SUFFIX)

    def usable(self, then: str = "rebuilding it") -> bool:
        """Whether there is an entry to read: whole as recorded, or written before records
        were kept (then the caller's load decides: ``loaded`` or ``discard``). A broken
        entry is said (``then``: what happens next), moved aside, and False."""
        if not os.path.lexists(self.path):
            return False
        fault = self.fault()
        if fault is not None:
            self.discard(fault, then)
            return False
        return True

    def recorded(self) -> bool:
        return self.record_path.is_file()

    def fault(self, thorough: bool = False) -> str | None:
        """What is wrong with the entry as it is on disk, in words; None when nothing is
        (or it has no record to check against). ``thorough``: hash every file."""
        if self.path.is_dir() != self.folder:
            return "a file where a folder belongs" if self.folder else "a folder, not a file"
        if not self.recorded():
            return None
        try:
            files = json.loads(self.record_path.read_text())["files"]
            wanted = {str(name): (int(f["size"]), str(f["sha256"])) for name, f in files.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"its record {self.record_path.name} is unreadable"
        for name, (size, sha256) in wanted.items():
            fault = _file_fault(self._file(name), name, size, sha256, thorough)
            if fault is not None:
                return fault
        return None

    def discard(self, why: str, then: str = "rebuilding it", say: bool = True) -> Path:
        """Say in one line what is broken, move the entry aside to
        ``<name>.broken-<time>`` (an earlier copy aside is removed: a cache that breaks
        again must not fill the disk) and drop its record; where it went."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.broken-{stamp}")
        for older in glob.glob(glob.escape(str(self.path)) + ".broken-*"):
            _remove(Path(older))
        try:
            os.replace(self.path, aside)
            if not self.folder:
                self.record_path.unlink(missing_ok=True)
        except FileNotFoundError:
            return aside  # another process moved it first, and said so
        except OSError as exc:
            raise cache_location_error(self.path, exc, "move aside") from None
        if say:
            console.print(
                f"warning: {self.what} in {self.path} was broken ({why}); moved aside to "
                f"{aside.name}, {then}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return aside

    def loaded(self) -> None:
        """The entry loaded: record it if it was written before records were kept (a
        failure to is no loss: it is recorded next time)."""
        if self.recorded():
            return
        staged = _staged_name(self.record_path)
        try:
            _write_all(staged, json.dumps(_record_of(self.path, self.folder, self.path.name)))
            os.replace(staged, self.record_path)
        except OSError:
            pass
        finally:
            staged.unlink(missing_ok=True)

    @contextlib.contextmanager
    def writing(self) -> Iterator[Path]:
        """A staged path beside the entry to write it to (an empty folder, or a file name
        with the entry's suffix); when the block ends it is recorded and renamed into
        place, replacing what was there. On any failure nothing is left, and an OSError
        is one line naming the place and $AUTOTUNE_CACHE: the block should only write."""
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cache_location_error(parent, exc, "create") from None
        _remove_stale_staged(self.path)
        staged = _staged_name(self.path)
        try:
            if self.folder:
                staged.mkdir()
            yield staged
            self._commit(staged)
        except BaseException as exc:
            _remove(staged)
            if isinstance(exc, OutputPathError) and isinstance(exc.__context__, OSError):
                exc = exc.__context__  # a writer's own line (files.atomic_path's names --out)
            if isinstance(exc, OSError):
                raise cache_location_error(self.path, exc, "write") from None
            raise

    def write_bytes(self, data: bytes) -> None:
        """The file entry's whole content, written and recorded (``writing``)."""
        with self.writing() as staged:
            _write_all(staged, data)

    @contextlib.contextmanager
    def reading(self, then: str) -> Iterator[None]:
        """Around a load of the entry that the caller cannot rebuild itself: an entry
        written before records that loads is recorded; a load that fails on an entry that
        is not as written (or has no record) discards it (``then``: what the user does
        about it) and the failure goes on as it was."""
        try:
            yield
        except MemoryError:
            raise
        except Exception as exc:
            fault = self._load_fault(exc)
            if fault is None:
                raise
            if not isinstance(exc, AutotuneError):
                self.discard(fault, then)
                raise
            # the user's one line says it all: what failed, where it went, what to do
            aside = self.discard(fault, then, say=False)
            raise type(exc)(f"{exc}; it was moved aside to {aside.name}: {then}") from None
        self.loaded()

    def obtain(self, build: Callable[[Path], None], read: Callable[[Path], T]) -> T:
        """``read(path)`` of the entry, after ``build(staged)`` made it where it was
        missing or broken. A read that fails on an entry that is not what was written
        (or has no record) discards it and builds it once more."""
        if self.usable():
            try:
                value = read(self.path)
            except MemoryError:
                raise
            except Exception as exc:
                fault = self._load_fault(exc)
                if fault is None:
                    raise  # the entry is as written: the failure is not the cache's
                self.discard(fault)
            else:
                self.loaded()
                return value
        with self.writing() as staged:
            build(staged)
        return read(self.path)

    def _load_fault(self, exc: Exception) -> str | None:
        """Why a load that failed with ``exc`` is the entry's fault (every hash checked),
        or None when the entry is as written and the failure is not the cache's."""
        if self.recorded():
            return self.fault(thorough=True)
        # the loader's own error where ours wraps it (ours names the folder again)
        shown = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        lines = str(shown).strip().splitlines()
        first = lines[0] if lines else "no message"
        first = first if len(first) <= 160 else first[:157] + "..."
        return f"it did not load: {type(shown).__name__}: {first}"

    def _file(self, name: str) -> Path:
        return self.path / name if self.folder else self.path

    def _commit(self, staged: Path) -> None:
        record = json.dumps(_record_of(staged, self.folder, self.path.name))
        if self.folder:
            _write_all(staged / FOLDER_RECORD, record)
            _replace_folder(staged, self.path)
            return
        # the old record must not vouch for the new file, should the run stop in between
        self.record_path.unlink(missing_ok=True)
        os.replace(staged, self.path)
        record_staged = _staged_name(self.record_path)
        try:
            _write_all(record_staged, record)
            os.replace(record_staged, self.record_path)
        finally:
            record_staged.unlink(missing_ok=True)


def _write_all(path: Path, data: str | bytes) -> None:
    """``data`` (text as UTF-8) as the whole of the file ``path``, by ``os.write`` until
    all is written (a full disk may write part, then refuse)."""
    view = memoryview(data.encode() if isinstance(data, str) else data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _staged_name(path: Path) -> Path:
    """A new name beside ``path`` that says which process writes it, keeping the suffix
    (writers that choose a format by it)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")


def _remove_stale_staged(path: Path) -> None:
    """Staged copies of ``path`` that a killed run left (a converted model's is hundreds
    of MB): those whose process has ended, and any older than a write could take (a
    process of that number may be another's by now)."""
    pattern = glob.escape(str(path.with_name(f".{path.name}."))) + "*.tmp*"
    for staged in glob.glob(pattern):
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(staged).name[len(path.name) + 2 :].split("-")[0])
            if not _alive(pid) or time.time() - os.path.getmtime(staged) > STALE_STAGED_S:
                _remove(Path(staged))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def _record_of(root: Path, folder: bool, name: str) -> dict:
    """Each file's size and sha256 (the files made durable on the way: a full disk may
    say so only when data is flushed)."""
    if folder:
        files = {
            p.relative_to(root).as_posix(): p
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != FOLDER_RECORD
        }
    else:
        files = {name: root}
    return {
        "schema": SCHEMA,
        "files": {
            key: {"size": p.stat().st_size, "sha256": _sha256(p)} for key, p in files.items()
        },
    }


def _sha256(path: Path, sync: bool = True) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
        if sync:
            os.fsync(f.fileno())
    return digest.hexdigest()


def _file_fault(path: Path, name: str, size: int, sha256: str, thorough: bool) -> str | None:
    try:
        found = path.stat().st_size
    except FileNotFoundError:
        return f"{name} is missing"
    if found != size:
        return f"{name} is {found} bytes where {size} were written"
    if (thorough or size <= HASH_LIMIT) and _sha256(path, sync=False) != sha256:
        return f"{name} is not what was written (its sha256 differs)"
    if path.suffix == ".safetensors" and not thorough and size > HASH_LIMIT:
        return _safetensors_fault(path, name, size)
    return None


def _safetensors_fault(path: Path, name: str, size: int) -> str | None:
    """A safetensors file's own check: an 8-byte header length, a JSON header, and
    tensors whose data ends where the file ends."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                return f"{name}'s header runs past its end"
            header = json.loads(f.read(length))
        ends = [t["data_offsets"][1] for key, t in header.items() if key != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return f"{name}'s header is unreadable"
    if 8 + length + max(ends, default=0) != size:
        return f"{name} does not end where its tensors do"
    return None


def _replace_folder(staged: Path, final: Path) -> None:
    """Rename ``staged`` to ``final``, moving a folder (or file) there out of the way."""
    try:
        os.rename(staged, final)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
    old = _staged_name(final)
    os.rename(final, old)
    try:
        os.rename(staged, final)
    finally:
        _remove(old)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
