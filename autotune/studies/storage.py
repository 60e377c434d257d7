"""The study database: Optuna's storage plus our own measurement cache, one SQLAlchemy URL."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from autotune.errors import StorageError

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"
ENV_STORAGE = "AUTOTUNE_STORAGE"


def storage_url(url: str | None = None) -> str:
    return url or os.environ.get(ENV_STORAGE) or DEFAULT_STORAGE


def _check_url(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(f"storage URL {url!r} is not a SQLAlchemy URL: use e.g. "
                           f"{DEFAULT_STORAGE} or postgresql://user@host/db") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).expanduser().resolve().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the folder of the study database {folder}: "
                               f"{exc.strerror}; pass --storage with a writable path") from None


def open_storage(url: str | None = None):
    """Optuna RDB storage for ``url``; fails with one line when it cannot be used."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    url = storage_url(url)
    _check_url(url)
    try:
        return optuna.storages.RDBStorage(url, skip_compatibility_check=False)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0][:200]
        raise StorageError(f"cannot open the study database {_redact(url)}: {reason}; "
                           "check --storage or AUTOTUNE_STORAGE") from None


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL has no password to hide that we can find
        return "<storage URL>"


class MeasurementCache:
    """Measurements worth keeping between runs, keyed by model fingerprint and hardware.

    A table of our own beside Optuna's, in the same database.
    """

    def __init__(self, url: str | None = None):
        import sqlalchemy as sa

        url = storage_url(url)
        _check_url(url)
        try:
            self._engine = sa.create_engine(url)
        except (sa.exc.SQLAlchemyError, ImportError) as exc:
            raise StorageError(f"cannot open the study database {_redact(url)}: "
                               f"{str(exc).splitlines()[0][:200]}; install its driver or "
                               "check --storage") from None
        meta = sa.MetaData()
        self._table = sa.Table(
            "autotune_measurements", meta,
            sa.Column("kind", sa.String(64), primary_key=True),
            sa.Column("fingerprint", sa.String(64), primary_key=True),
            sa.Column("hardware", sa.String(256), primary_key=True),
            sa.Column("key", sa.String(256), primary_key=True),
            sa.Column("payload", sa.Text, nullable=False),
            sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        )
        try:
            meta.create_all(self._engine)
        except sa.exc.SQLAlchemyError as exc:
            raise StorageError(f"cannot use the study database {_redact(url)}: "
                               f"{str(exc).splitlines()[0][:200]}") from None

    def get(self, kind: str, fingerprint: str, hardware: str, key: str):
        import sqlalchemy as sa

        t = self._table
        query = sa.select(t.c.payload).where(t.c.kind == kind, t.c.fingerprint == fingerprint,
                                             t.c.hardware == hardware, t.c.key == key)
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else json.loads(row[0])

    def put(self, kind: str, fingerprint: str, hardware: str, key: str, payload) -> None:
        import sqlalchemy as sa

        t = self._table
        ident = dict(kind=kind, fingerprint=fingerprint, hardware=hardware, key=key)
        with self._engine.begin() as conn:
            conn.execute(sa.delete(t).where(*(t.c[k] == v for k, v in ident.items())))
            conn.execute(sa.insert(t).values(**ident, payload=json.dumps(payload),
                                             created=datetime.now(timezone.utc)))
