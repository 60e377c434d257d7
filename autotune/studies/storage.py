"""The study database: Optuna's storage plus our own measurement cache, one SQLAlchemy URL."""

from __future__ import annotations

import importlib
import json
import time
from datetime import UTC, datetime

from autotune.errors import StorageError
from autotune.studies.database import (
    check_url,
    created_meanwhile,
    redact,
    storage_url,
    undone_if_failed,
)


def open_storage(url: str | None = None):
    """Optuna RDB storage for ``url``; fails with one line when it cannot be used."""
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.studies.rdb import connect

    url = storage_url(url)
    with undone_if_failed(url):
        check_url(url)
        try:
            return connect(url)
        except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as exc:
            # RuntimeError: a database whose schema another Optuna version wrote
            reason = str(exc).strip().splitlines()[0][:300]
            raise StorageError(
                f"cannot open the study database {redact(url)}: {reason}; "
                "check --storage or AUTOTUNE_STORAGE"
            ) from None


class MeasurementCache:
    """Measurements worth keeping between runs, keyed by model fingerprint and hardware.

    A table of our own beside Optuna's, in the same database.
    """

    def __init__(self, url: str | None = None):
        url = storage_url(url)
        with undone_if_failed(url):
            check_url(url)
            self._open(url)

    def _open(self, url: str) -> None:
        import sqlalchemy as sa

        try:
            self._engine = sa.create_engine(url, **_engine_kwargs(url))
        except (sa.exc.SQLAlchemyError, ImportError) as exc:
            raise StorageError(
                f"cannot open the study database {redact(url)}: "
                f"{str(exc).splitlines()[0][:200]}; install its driver or "
                "check --storage"
            ) from None
        meta = sa.MetaData()
        self._table = sa.Table(
            "autotune_measurements",
            meta,
            sa.Column("kind", sa.String(64), primary_key=True),
            sa.Column("fingerprint", sa.String(64), primary_key=True),
            sa.Column("hardware", sa.String(256), primary_key=True),
            sa.Column("key", sa.String(256), primary_key=True),
            sa.Column("payload", sa.Text, nullable=False),
            sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        )
        for attempt in range(3):  # a fresh database: another process may create it too
            try:
                meta.create_all(self._engine)
                return
            except sa.exc.SQLAlchemyError as exc:
                error = exc
                if not created_meanwhile(exc):
                    break
                time.sleep(0.5 * (attempt + 1))
        raise StorageError(
            f"cannot use the study database {redact(url)}: {str(error).splitlines()[0][:200]}; "
            "check --storage or AUTOTUNE_STORAGE"
        )

    def get(self, kind: str, fingerprint: str, hardware: str, key: str):
        import sqlalchemy as sa

        t = self._table
        query = sa.select(t.c.payload).where(
            t.c.kind == kind,
            t.c.fingerprint == fingerprint,
            t.c.hardware == hardware,
            t.c.key == key,
        )
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else json.loads(row[0])

    def put(self, kind: str, fingerprint: str, hardware: str, key: str, payload) -> None:
        import sqlalchemy as sa

        t = self._table
        ident = {"kind": kind, "fingerprint": fingerprint, "hardware": hardware, "key": key}
        row = dict(ident, payload=json.dumps(payload), created=datetime.now(UTC))
        with self._engine.begin() as conn:
            dialect = conn.dialect.name
            if dialect in ("postgresql", "sqlite"):
                # one statement: two processes writing the same key cannot collide
                insert = importlib.import_module(f"sqlalchemy.dialects.{dialect}").insert
                stmt = insert(t).values(**row)
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=list(ident),
                        set_={"payload": stmt.excluded.payload, "created": stmt.excluded.created},
                    )
                )
            else:
                conn.execute(sa.delete(t).where(*(t.c[k] == v for k, v in ident.items())))
                conn.execute(sa.insert(t).values(**row))


def _engine_kwargs(url: str) -> dict:
    """SQLite takes one writer at a time: wait for the lock rather than fail."""
    from sqlalchemy.engine import make_url

    if make_url(url).get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": 60}}
    return {}
