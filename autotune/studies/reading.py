"""What the study database holds, read without writing: its studies and their trials as
plain values (``StudySummary``, ``TrialRow``), through Optuna's own storage API.

Reads the database only: no model, no Ray, no torch, so it works as well on a database
written by another machine, copied here or served by PostgreSQL. No table is created or
migrated, and a SQLite file is opened read-only (a full disk, a file of another user's:
still readable); only ``StudyDatabase.delete`` opens it for writing.
"""

from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import StorageError, StudyNotFoundError
from autotune.studies.database import check_url, redact, storage_url

FAIL_REASON = "fail_reason"  # trial user attr: why it failed (studies.trainable, studies.search)
CLOSE_NAMES = 3  # suggestions for a mistyped study name

if TYPE_CHECKING:
    from autotune.studies.rdb import SchemaMismatch

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class TrialRow:
    number: int
    state: str
    value: float | None  # None: failed, running, or pruned
    params: dict[str, Any]
    user_attrs: dict[str, Any]  # measured figures, and fail_reason for a failed trial
    started: datetime | None
    completed: datetime | None

    @classmethod
    def of(cls, trial: FrozenTrial) -> TrialRow:
        values = trial.values or []
        value = values[0] if len(values) == 1 and math.isfinite(values[0]) else None
        return cls(
            trial.number,
            trial.state.name,
            value,
            dict(trial.params),
            dict(trial.user_attrs),
            trial.datetime_start,
            trial.datetime_complete,
        )

    @property
    def fail_reason(self) -> str | None:
        return self.user_attrs.get(FAIL_REASON)

    @property
    def duration_s(self) -> float | None:
        if self.started is None or self.completed is None:
            return None
        return (self.completed - self.started).total_seconds()

    @property
    def last_seen(self) -> datetime | None:
        return self.completed or self.started

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "value": self.value,
            "params": self.params,
            "fail_reason": self.fail_reason,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "started": _iso(self.started),
            "completed": _iso(self.completed),
            "user_attrs": self.user_attrs,
        }


@dataclass
class StudySummary:
    name: str
    user_attrs: dict[str, Any]
    direction: str  # "maximize", "minimize", or "multi-objective"
    trials: list[TrialRow]  # best first (see ranked)

    @property
    def best(self) -> TrialRow | None:
        return next((t for t in self.trials if t.state == "COMPLETE" and t.value is not None), None)

    def count(self, state: str) -> int:
        return sum(1 for t in self.trials if t.state == state)

    @property
    def last_update(self) -> datetime | None:
        seen = [t.last_seen for t in self.trials if t.last_seen is not None]
        return max(seen) if seen else None

    @property
    def speedup(self) -> float | None:
        """The best trial's measured speedup (a proxy study's objective is no speedup)."""
        return None if self.best is None else self.best.user_attrs.get("speedup")

    def as_dict(self) -> dict[str, Any]:
        """What `studies list` shows of it, for programs (`-f json|yaml`)."""
        best = self.best
        return {
            "study": self.name,
            "model": self.user_attrs.get("model"),
            "method": self.user_attrs.get("method"),
            "objective": self.user_attrs.get("objective"),
            "direction": self.direction,
            "trials": {
                state.lower(): self.count(state)
                for state in ("COMPLETE", "FAIL", "RUNNING", "WAITING", "PRUNED")
            },
            "best_value": None if best is None else best.value,
            "best_trial": None if best is None else best.number,
            "speedup": self.speedup,
            "last_update": _iso(self.last_update),
        }


def ranked(trials: list[FrozenTrial], direction: str) -> list[TrialRow]:
    """Trials with a value, best first; then the others by number."""
    sign = 1.0 if direction == "minimize" else -1.0
    rows = [TrialRow.of(t) for t in trials]
    return sorted(
        rows, key=lambda r: (r.value is None, 0.0 if r.value is None else sign * r.value, r.number)
    )


def _database_errors(method):
    """A database that fails mid-read (locked, dropped connection): one line, no traceback."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return method(self, *args, **kwargs)
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            reason = str(exc).strip().splitlines()[0][:200]
            raise StorageError(f"cannot read the study database {self.where}: {reason}") from None

    return run


class StudyDatabase:
    """The studies in one Optuna RDB storage, read through Optuna's own storage API."""

    def __init__(self, url: str | None = None):
        self.url = storage_url(url)
        _require_existing(self.url)
        check_url(self.url)  # an unparsable URL: one line that says how to write one
        self.storage = self._open(read_only=True)

    @property
    def where(self) -> str:
        return redact(self.url)

    @_database_errors
    def names(self) -> list[str]:
        return sorted(s.study_name for s in self.storage.get_all_studies())

    @_database_errors
    def summaries(self) -> list[StudySummary]:
        studies = sorted(self.storage.get_all_studies(), key=lambda s: s.study_name)
        return [
            self._summary(
                self.storage.get_study_id_from_name(s.study_name),
                s.study_name,
                s.user_attrs,
                s.directions,
            )
            for s in studies
        ]

    @_database_errors
    def summary(self, name: str) -> StudySummary:
        study_id = self._study_id(name)
        return self._summary(
            study_id,
            name,
            self.storage.get_study_user_attrs(study_id),
            self.storage.get_study_directions(study_id),
        )

    @_database_errors
    def load(self, name: str) -> optuna.Study:
        self._study_id(name)
        return optuna.load_study(study_name=name, storage=self.storage)

    @_database_errors
    def delete(self, name: str) -> None:
        """The study and its trials; nothing else (the measurement cache stays). The one
        command that writes: it opens the database for writing just for this."""
        self._open(read_only=False).delete_study(self._study_id(name))

    def _open(self, read_only: bool) -> optuna.storages.RDBStorage:
        """The storage as it is: no table created or migrated (SQLite: opened read-only
        unless asked). A schema of another Optuna, or no Optuna database: one line."""
        from sqlalchemy.exc import SQLAlchemyError

        from autotune.studies.rdb import SchemaMismatch, open_existing

        try:
            return open_existing(self.url, read_only=read_only)
        except SchemaMismatch as exc:
            raise StorageError(_schema_line(exc, self.where)) from None
        except (
            SQLAlchemyError,
            optuna.exceptions.StorageInternalError,  # Optuna's wrapper: the cause says why
            ImportError,
            ValueError,
            AssertionError,  # Optuna's version check on a database without its tables
        ) as exc:
            cause = exc.__cause__ or exc
            reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
            if "no such table" in reason or "does not exist" in reason:
                raise StorageError(
                    f"{self.where} is no Optuna study database ({reason}); check --storage "
                    "or AUTOTUNE_STORAGE"
                ) from None
            raise StorageError(
                f"cannot open the study database {self.where}: {reason}; "
                "check --storage or AUTOTUNE_STORAGE"
            ) from None

    def _summary(self, study_id: int, name: str, attrs: dict, directions) -> StudySummary:
        direction = directions[0].name.lower() if len(directions) == 1 else "multi-objective"
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        return StudySummary(name, dict(attrs), direction, ranked(trials, direction))

    def _study_id(self, name: str) -> int:
        try:
            return self.storage.get_study_id_from_name(name)
        except KeyError:
            raise StudyNotFoundError(unknown_study(name, self.names(), self.where)) from None


def _schema_line(exc: SchemaMismatch, where: str) -> str:
    if exc.older:
        return (
            f"the study database {where} has the table schema of an older Optuna "
            f"({exc.current}; Optuna {optuna.__version__} reads {exc.head}): upgrade it with "
            f"`optuna storage upgrade --storage {where}` (a copy first keeps the old one)"
        )
    return (
        f"the study database {where} has the table schema of a newer Optuna "
        f"({exc.current}) than this one ({optuna.__version__}): `pip install -U optuna`"
    )


def unknown_study(name: str, names: list[str], where: str) -> str:
    """One line: the closest names (a prefix of theirs counts too), and where to see all."""
    close = [n for n in names if n.startswith(name.rstrip("/") + "/")]
    close += [
        n
        for n in difflib.get_close_matches(name, names, n=CLOSE_NAMES, cutoff=0.75)
        if n not in close
    ]
    hint = f"; did you mean {', '.join(close[:CLOSE_NAMES])}?" if close else ""
    count = f"{len(names)} {'study' if len(names) == 1 else 'studies'}"
    return (
        f"no study named '{name}' in {where} ({count}){hint} "
        "Run `autotune studies list` to see them all"
    )


def _require_existing(url: str) -> None:
    """A read of a SQLite file that is not there would create an empty database."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # check_url says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(parsed.database).expanduser()
    if not path.is_file():
        raise StorageError(
            f"no study database at {path}: `autotune profile` creates it; "
            "or point --storage (or AUTOTUNE_STORAGE) at an existing one"
        )


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()
