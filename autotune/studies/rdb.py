"""Optuna's RDB storage as autotune opens it: with Optuna's heartbeat for stale trials
(``autotune.studies.trials``), pickled without the database password, and with SQLite
set up for more than one writing process. Imports Optuna."""

from __future__ import annotations

import contextlib
import inspect
import os
import time
import warnings
from typing import Any

import optuna
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from autotune.studies import trials as held
from autotune.studies.database import created_meanwhile, redact

SQLITE_BUSY_TIMEOUT_S = 60  # SQLite takes one writer at a time: wait for the lock, don't fail
CREATE_TRIES = 3  # two processes creating the tables of a fresh database can collide

_URLS: dict[str, str] = {}  # redacted URL -> URL, for unpickling in this process only


class RDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose pickled form has no database password.

    Ray Tune pickles its searcher, and so this storage, into the experiment folder
    (``tuner.pkl``, searcher checkpoints). Unpickled in the process that opened it, or in
    one whose ``$AUTOTUNE_STORAGE`` is the same URL (Ray workers inherit it), it gets its
    password back; anywhere else it connects without one.
    """

    def _create_new_trial(self, study_id: int, template_trial=None):
        """A trial asked for here is this process's from the moment it exists: a sampler
        may take seconds (a GP over many parameters) before ask() returns, and a stale-trial
        scan meanwhile must not take it for one a dead process left behind."""
        if template_trial is None:
            template_trial = optuna.trial.create_trial(
                state=optuna.trial.TrialState.RUNNING,
                user_attrs={held.OWNER: held.this_process()},
            )
        # Optuna's cached storage, which studies wrap this in, calls this private method
        frozen = super()._create_new_trial(study_id, template_trial)
        if frozen.state == optuna.trial.TrialState.RUNNING and self.heartbeat_interval:
            self.record_heartbeat(frozen._trial_id)
        return frozen

    def set_trial_state_values(self, trial_id: int, state, values=None) -> bool:
        """An enqueued trial taken up here (WAITING -> RUNNING) is owned at once too. Its
        heartbeat comes first, so that it is never RUNNING without one (a heartbeat of a
        trial another process takes up instead does no harm)."""
        running = state == optuna.trial.TrialState.RUNNING
        if running and self.heartbeat_interval:
            self.record_heartbeat(trial_id)
        changed = super().set_trial_state_values(trial_id, state, values)
        if changed and running:
            self.set_trial_user_attr(trial_id, held.OWNER, held.this_process())
        return changed

    def adopt_unbeaten(self, trial_ids: list[int]) -> None:
        """A heartbeat now for each of these trials that has never had one (left RUNNING
        by an older autotune or by another tool): from here on the grace period decides,
        and a live owner that beats keeps it."""
        import sqlalchemy as sa
        from optuna.storages._rdb import models

        if not trial_ids or not self.heartbeat_interval:
            return
        beats = models.TrialHeartbeatModel
        with self.engine.connect() as conn:
            query = sa.select(beats.trial_id).where(beats.trial_id.in_(trial_ids))
            have = set(conn.execute(query).scalars())
        for trial_id in trial_ids:
            if trial_id not in have:
                # another process adopting it at the same moment: its row is as good
                with contextlib.suppress(IntegrityError, optuna.exceptions.StorageInternalError):
                    self.record_heartbeat(trial_id)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        hidden = redact(self.url)
        if hidden != self.url:
            _URLS[hidden] = self.url
            state["url"] = hidden
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["url"] = _password_back(state["url"])
        super().__setstate__(state)


def _password_back(hidden: str) -> str:
    if hidden in _URLS:
        return _URLS[hidden]
    env = os.environ.get("AUTOTUNE_STORAGE")
    if env and redact(env) == hidden:
        return env
    return hidden


def connect(
    url: str, heartbeat_s: int = held.HEARTBEAT_S, grace_s: int = held.GRACE_S
) -> RDBStorage:
    """Open (and on first use create) the Optuna tables behind ``url``, with Optuna's
    heartbeat: ``heartbeat_s`` between beats, ``grace_s`` before a silent trial is stale."""
    kwargs = {}
    if make_url(url).get_backend_name() == "sqlite":
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        _sqlite_wal(url)
    heartbeat: dict[str, Any] = {
        "heartbeat_interval": heartbeat_s,
        "grace_period": grace_s,
        _CALLBACK_ARGUMENT: held.requeue_stale,
    }
    for attempt in range(CREATE_TRIES):
        try:
            with warnings.catch_warnings():
                # the heartbeat arguments are "experimental" to Optuna: not the user's concern
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url, engine_kwargs=kwargs, skip_compatibility_check=False, **heartbeat
                )
        except (IntegrityError, ProgrammingError, OperationalError) as exc:
            if attempt == CREATE_TRIES - 1 or not created_meanwhile(exc):
                raise
            time.sleep(0.5 * (attempt + 1))  # and look again
    raise AssertionError("unreachable")


# Optuna 4.9 renamed the failed-trial callback; the older name warns from then on
_CALLBACK_ARGUMENT = (
    "heartbeat_stale_trial_callback"
    if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
    else "failed_trial_callback"
)


def _sqlite_wal(url: str) -> None:
    """Write-ahead logging: readers no longer block the writer, so several processes
    (two `profile` runs, the study commands) can share one SQLite file. Persistent."""
    import sqlite3

    path = make_url(url).database
    if not path or path == ":memory:":
        return
    try:
        conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
    except sqlite3.Error:
        pass  # e.g. a read-only file: Optuna's own error says more


def open_existing(url: str, *, read_only: bool = True) -> optuna.storages.RDBStorage:
    """Optuna's storage of a study database that is already there, as the study commands
    open it: no table created, no schema migrated or stamped, no journal mode changed, and
    a SQLite file opened read-only (SQLite's ``mode=ro``) unless ``read_only`` is False.

    Raises SchemaMismatch when another Optuna version wrote the schema; SQLAlchemy's
    errors when the database cannot be read (not an Optuna database, say).
    """
    kwargs: dict[str, Any] = {}
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        if read_only:
            kwargs = {"creator": _read_only_sqlite(parsed.database)}
    storage = optuna.storages.RDBStorage(
        url, engine_kwargs=kwargs, skip_compatibility_check=True, skip_table_creation=True
    )
    _check_schema(storage)
    return storage


class SchemaMismatch(RuntimeError):
    """The database's tables are of another Optuna version's schema."""

    def __init__(self, current: str, head: str, older: bool):
        super().__init__(current, head, older)
        self.current, self.head, self.older = current, head, older


def _check_schema(storage: optuna.storages.RDBStorage) -> None:
    """Optuna's own check, without its writes: Optuna stamps a schema version it cannot
    find (a read-only file refuses that), and says "upgrade" in a paragraph."""
    current, head = storage.get_current_version(), storage.get_head_version()
    if current != head:
        raise SchemaMismatch(current, head, older=current in storage.get_all_versions())


def _read_only_sqlite(path: str):
    """A connection factory: ``path`` as a SQLite URI filename with ``mode=ro``. A read
    takes the shared lock as any reader does; nothing is written, no journal created
    (a WAL database gets the ``-wal``/``-shm`` files its readers need, if absent)."""
    import sqlite3
    from pathlib import Path
    from urllib.parse import quote

    uri = f"file:{quote(str(Path(path).expanduser().resolve()))}?mode=ro"

    def connect() -> sqlite3.Connection:
        # SQLAlchemy's pool hands a connection to one thread at a time (the dashboard
        # serves each request in a thread of its own)
        return sqlite3.connect(
            uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False
        )

    return connect
