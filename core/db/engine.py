"""Engines: which database a process uses and how it connects.

One engine per process and URL (:func:`open_database` caches them): engines own connection pools and
are thread-safe, sessions are not.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from core.settings import Settings


class SchemaOutOfDate(RuntimeError):
    """The database's schema is not at this code's head revision (a deploy step not run yet)."""


#: The errors that mean "the database cannot be used right now" (as opposed to a bad statement):
#: callers retry these later, and never treat them as a verdict on the data.
DB_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeoutError, SchemaOutOfDate)


def database_url(settings: Settings) -> str:
    """``settings.database_url``, or the embedded SQLite file ``{cache_dir}/sluice.db``."""
    return settings.database_url or f"sqlite:///{settings.cache_dir / 'sluice.db'}"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_db_engine(url: str) -> Engine:
    """A new engine for ``url``. SQLite files get their directory, WAL journaling (readers never
    wait for the bookkeeper's writes) and a busy timeout; PostgreSQL connections are pinged before
    use, so a database that restarted costs one failed attempt, not one per pooled connection."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 5})
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@functools.cache
def open_database(url: str) -> Engine:
    """The process's engine for ``url``, its schema checked: an embedded (SQLite) database is brought
    up to date; any other must already be (``sluice db upgrade``), else SchemaOutOfDate.

    Raises one of :data:`DB_UNAVAILABLE` when the database cannot be used; nothing is cached then,
    so the next call tries again.
    """
    from core.db.migrate import current_revision, head_revision, upgrade

    engine = create_db_engine(url)
    try:
        if is_sqlite(url):
            upgrade(url)
        elif (current := current_revision(engine)) != (head := head_revision()):
            raise SchemaOutOfDate(f"database schema at revision {current}, this code needs {head}: "
                                  "run `sluice db upgrade` (or `alembic upgrade head`)")
    except BaseException:
        engine.dispose()
        raise
    return engine
