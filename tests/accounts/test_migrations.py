"""The migrations, run the way operators run them (``alembic upgrade head`` from the repo root, URL from
SLUICE_DATABASE_URL), up and down, on SQLite and PostgreSQL; and the models agree with them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from bench.devstack import REPO
from core.db import SchemaOutOfDate, database_url, open_database
from core.db.migrate import current_revision, head_revision, upgrade
from core.db.models import Base
from core.settings import Settings

TABLES = {"api_keys", "usage_records"}


def alembic(url: str, *args: str) -> None:
    env = {**os.environ, "SLUICE_DATABASE_URL": url}
    done = subprocess.run([sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_then_downgrade_from_the_command_line(db_url: str) -> None:
    assert tables(db_url) == set()
    alembic(db_url, "upgrade", "head")
    assert tables(db_url) == TABLES | {"alembic_version"}
    alembic(db_url, "downgrade", "base")
    assert tables(db_url) == {"alembic_version"}
    alembic(db_url, "upgrade", "head")
    assert tables(db_url) == TABLES | {"alembic_version"}


def test_models_match_the_migrations(migrated_url: str) -> None:
    engine = sa.create_engine(migrated_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
            assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
    assert diff == []


def test_constraints_hold_even_without_validation(migrated_url: str) -> None:
    """Limits are checked by the schema too: a negative rpm cannot be stored by any path."""
    engine = sa.create_engine(migrated_url)
    try:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
            connection.execute(sa.text(
                "INSERT INTO api_keys (id, name, secret_sha256, rpm, is_admin, created_at) "
                "VALUES ('0123456789ab', 'x', 'h', -1, false, CURRENT_TIMESTAMP)"))
        with engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM api_keys")).scalar_one() == 0
    finally:
        engine.dispose()


def test_default_database_is_sqlite_under_the_cache_dir(tmp_path) -> None:  # noqa: ANN001
    settings = Settings(cache_dir=tmp_path / "cache", database_url=None)
    url = database_url(settings)
    assert url == f"sqlite:///{tmp_path / 'cache' / 'sluice.db'}"
    open_database(url)  # embedded: brought up to date by whoever opens it first
    assert (tmp_path / "cache" / "sluice.db").is_file()
    assert tables(url) == TABLES | {"alembic_version"}


@pytest.mark.postgres
def test_postgres_is_not_migrated_behind_the_operators_back(pg_db) -> None:  # noqa: ANN001
    with pytest.raises(SchemaOutOfDate, match="sluice db upgrade"):
        open_database(pg_db.url)
    assert tables(pg_db.url) == set()
    upgrade(pg_db.url)
    engine = open_database(pg_db.url)  # now at head: opens, and the schema is usable
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM api_keys")).scalar_one() == 0
