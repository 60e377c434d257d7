"""Writing whole or not at all (``autotune.files``): a full disk, a failing writer or an
unwritable place leaves no file, no temporary file and no folder made for it, and says so
in one line."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from autotune.errors import OutputPathError
from autotune.files import atomic_path, check_writable, write_atomic


@pytest.fixture
def full_disk(monkeypatch):
    """os.write writes part of what it is given once, then the disk is full."""
    real = os.write
    calls = []

    def write(fd: int, data) -> int:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bytes(data)[: max(1, len(data) // 2)])

    monkeypatch.setattr(os, "write", write)
    return calls


def test_write_atomic_on_a_full_disk_leaves_nothing(tmp_path, full_disk):
    target = tmp_path / "new" / "folder" / "out.yaml"
    with pytest.raises(OutputPathError) as err:
        write_atomic(target, "a: 1\n" * 1000)
    assert len(full_disk) == 2  # half was written before the disk filled
    message = str(err.value)
    assert "\n" not in message and str(target) in message and "no space left" in message
    assert list(tmp_path.iterdir()) == []  # no file, no temporary, no folder made for it


def test_a_failed_write_keeps_the_file_it_would_replace(tmp_path, full_disk):
    target = tmp_path / "out.yaml"
    target.write_text("old\n")
    with pytest.raises(OutputPathError):
        write_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_write_atomic_writes_with_the_usual_mode(tmp_path):
    target = tmp_path / "out.txt"
    write_atomic(target, "text\n")
    assert target.read_text() == "text\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_path_removes_the_temporary_when_the_writer_fails(tmp_path):
    target = tmp_path / "plot.png"
    with pytest.raises(ValueError), atomic_path(target) as temp:
        assert temp.suffix == ".png" and temp.parent == tmp_path
        temp.write_bytes(b"half a plot")
        raise ValueError("the writer failed")
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_turns_a_writers_os_error_into_one_line(tmp_path):
    target = tmp_path / "plot.png"
    with pytest.raises(OutputPathError, match=r"read-only.*--out"), atomic_path(target):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    assert list(tmp_path.iterdir()) == []


def test_check_writable_on_a_full_disk(tmp_path, monkeypatch):
    def write(fd: int, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OutputPathError, match="no space left"):
        check_writable(tmp_path / "a" / "p.yaml")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("target", "words"),
    [
        (Path("/proc/p.yaml"), "cannot hold files"),
        (Path("/proc/nope/p.yaml"), "cannot create the folder /proc/nope"),
    ],
)
def test_check_writable_refuses_what_cannot_hold_files(target, words):
    with pytest.raises(OutputPathError, match=words):
        check_writable(target)
    assert not target.exists()


def test_check_writable_under_a_file(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(OutputPathError, match="in the way"):
        check_writable(blocker / "p.yaml")
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and blocker.read_text() == "x"
