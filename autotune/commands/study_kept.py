"""The study database of a command that tunes (`profile`, `verify --tune`), when it stops
before its end: a SQLite database it created and left holding nothing is removed, with
the folders made for it; one holding finished trials is kept, and the interruption says
where, and that the same command resumes them."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from autotune.commands import interrupt
from autotune.studies.database import SQLITE_SIDE_FILES, sqlite_file, storage_url

# Rows every Optuna database holds from its creation: no measurement of this run's.
_BOOKKEEPING = frozenset({"version_info", "alembic_version"})


@contextlib.contextmanager
def kept_or_removed(storage: str | None) -> Iterator[None]:
    """The block tunes in ``storage`` (as ``--storage`` gives it); if it does not end
    normally, a database it created and left empty is removed, and the interruption
    says what stays."""
    path = sqlite_file(storage_url(storage))
    made = interrupt.missing_folders(path.parent) if path is not None else []
    fresh = path is not None and not path.exists()
    try:
        yield
    except BaseException:
        if path is None:
            interrupt.note("finished study trials are kept in the study database")
        elif fresh and not path.exists():
            _remove(path, made)  # stopped before it made one: only the folders it made
        elif fresh and _empty(path):
            _remove(path, made)
            interrupt.note(f"removed the empty study database it had made ({path})")
        else:
            interrupt.note(_kept(path))
        raise


def _kept(path: Path) -> str:
    """What the interruption says of a database left in place."""
    finished = _finished_trials(path)
    if finished:
        return (
            f"finished study trials are kept in {path} ({finished}), and running the same "
            "command again resumes them"
        )
    return f"no study trial had finished (the study database is {path})"


def _empty(path: Path) -> bool:
    """No row of a measurement, study or trial in the SQLite file."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
            tables = [
                row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            return not any(
                db.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone()
                for table in tables
                if table not in _BOOKKEEPING
            )
    except sqlite3.Error:
        return False  # unreadable now: not ours to judge empty


def _finished_trials(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
            row = db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
    except sqlite3.Error:
        return 0  # no trials table: no study was made
    return int(row[0])


def _remove(path: Path, made: list[Path]) -> None:
    for suffix in ("", *SQLITE_SIDE_FILES):
        with contextlib.suppress(OSError):
            Path(f"{path}{suffix}").unlink()
    for folder in made:  # deepest first; one holding something else stays
        with contextlib.suppress(OSError):
            folder.rmdir()
