"""Alembic, driven from code: the same migrations that ``alembic upgrade head`` runs from the repo root.

Migrating an embedded SQLite file is serialised with a lock file next to it, so processes that start
together (frontend, bookkeeper, ``sluice keys``) do not race to create the same tables.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An alembic configuration for ``url`` (migrations/env.py takes the URL from ``attributes``)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    with _migration_lock(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    with _migration_lock(url):
        command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None for an empty database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        yield
        return
    lock_path = Path(parsed.database).expanduser()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path.with_name(lock_path.name + ".migrate-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
