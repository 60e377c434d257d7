"""What a command leaves and says when it is stopped (Ctrl-C, SIGTERM) or fails part way:
what it created is removed unless it finished, and the one line said is true of that
command (issue 43: `heads train` used to speak of study trials it has none of, and left
the empty heads folder it had made).

A command says what stays true if it stops now (``tell``) and wraps the work that makes
a folder in ``removed_unless_finished``; ``autotune.cli.errors.user_errors`` opens one
``Interruption`` per command (``command``) and prints its ``message()``."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# What most commands can say: they write nothing, or write it whole at their end.
NOTHING_WRITTEN = "nothing was written"


@dataclass
class Interruption:
    """What is true of the running command if it stops now: ``told`` (set by the command)
    and what its cleanups removed or kept (``notes``, in the order they happened)."""

    told: str = NOTHING_WRITTEN
    notes: list[str] = field(default_factory=list)

    def message(self) -> str:
        return "interrupted: " + "; ".join([self.told, *self.notes])


# The running commands' interruptions, innermost last (a command may call another's code);
# outside any command, a throwaway one takes what is told.
_running: list[Interruption] = []


@contextlib.contextmanager
def command() -> Iterator[Interruption]:
    """The interruption of the command run inside the block."""
    interruption = Interruption()
    _running.append(interruption)
    try:
        yield interruption
    finally:
        _running.remove(interruption)


def current() -> Interruption:
    return _running[-1] if _running else Interruption()


def tell(text: str) -> None:
    """What stays true of the running command if it stops from now on."""
    current().told = text


def note(text: str) -> None:
    """What a cleanup did, said after what the command told."""
    current().notes.append(text)


@contextlib.contextmanager
def removed_unless_finished(folder: Path, what: str) -> Iterator[None]:
    """The block may create ``folder`` (and parents of it that are missing now): unless
    it ends normally, the ones it created are removed, ``folder`` with whatever was
    written in it, its parents only when empty. A folder that existed before the block
    is never removed. ``what`` names the folder in the note (e.g. "the heads folder")."""
    made = missing_folders(Path(folder))
    try:
        yield
    except BaseException:
        if made:
            _remove_made(made, what)
        raise


def _remove_made(made: list[Path], what: str) -> None:
    """``made[0]`` (the folder) with what is in it, then its parents in ``made`` that
    are empty, deepest first; the note says the folder, or the empty ones above it
    where the folder itself was not made yet (a writer that stages and renames)."""
    folder_made = made[0].is_dir()
    shutil.rmtree(made[0], ignore_errors=True)
    emptied = []
    for parent in made[1:]:  # one holding something else stays
        with contextlib.suppress(OSError):
            parent.rmdir()
            emptied.append(parent)
    if folder_made and not made[0].exists():
        note(f"removed {what} it had made ({made[0]})")
    elif emptied:
        note(f"removed the empty folder it had made ({emptied[-1]})")


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist, deepest first (empty: it exists)."""
    missing = []
    current_folder = folder.absolute()
    while not current_folder.exists() and current_folder != current_folder.parent:
        missing.append(current_folder)
        current_folder = current_folder.parent
    return missing
