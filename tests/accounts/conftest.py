"""Fixtures of the accounts tests: real databases (SQLite file, scratch PostgreSQL database), settings
pointing at them and at the session's private Redis, and a started Accounts service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from app.accounts.service import Accounts
from core.db.migrate import upgrade
from core.keys import Keys
from core.settings import AccountsSettings, Settings
from tests.accounts.helpers import ScratchPostgres, postgres_unreachable_reason

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def postgres_skip_reason() -> str | None:
    return postgres_unreachable_reason()


@pytest.fixture
def pg_db(postgres_skip_reason: str | None) -> Iterator[ScratchPostgres]:
    if postgres_skip_reason:
        pytest.skip(postgres_skip_reason)
    db = ScratchPostgres().create()
    yield db
    db.drop()


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # noqa: ANN001
    return f"sqlite:///{tmp_path / 'sluice.db'}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """An empty database of each backend."""
    if request.param == "sqlite":
        return sqlite_url
    return request.getfixturevalue("pg_db").url


@pytest.fixture
def migrated_url(db_url: str) -> str:
    upgrade(db_url)
    return db_url


def make_settings(database_url: str, redis_url: str, namespace: str, **accounts: object) -> Settings:
    return Settings(database_url=database_url, auth=True, redis_url=redis_url, namespace=namespace,
                    accounts=AccountsSettings(**accounts))


@pytest.fixture
async def aredis(redis_server) -> AsyncIterator[aioredis.Redis]:  # noqa: ANN001
    client = aioredis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def clean_queue(redis_client: redis.Redis, namespace: str) -> Iterator[str]:
    """The namespace's bookkeeping queue (its Redis list: ``Keys.broker_queue_list``), emptied after the test
    with the rest of the namespace (the Redis fixture cleans ``sluice:{ns}:*``)."""
    yield Keys(namespace).bookkeeping_queue


@pytest.fixture
async def accounts(sqlite_url: str, redis_server, namespace: str, aredis: aioredis.Redis,  # noqa: ANN001
                   redis_client: redis.Redis, clean_queue: str) -> AsyncIterator[Accounts]:
    """A started Accounts service with auth on, on a fresh SQLite database."""
    upgrade(sqlite_url)
    service = Accounts(make_settings(sqlite_url, redis_server.url, namespace), aredis, Keys(namespace))
    await service.start()
    yield service
    await service.close()
