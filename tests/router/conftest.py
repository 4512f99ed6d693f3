"""Fixtures for the router tests: async Redis clients on the session's private server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from core.keys import Keys
from router.prefix_index import PrefixIndex
from router.registry import Registry
from tests.router.factories import RoundTripCounter


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace)


@pytest.fixture
async def aredis(redis_server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[aioredis.Redis]:
    """An async client; ``redis_client`` (sync) deletes the test's keys afterwards."""
    client = aioredis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
async def counter(redis_server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[RoundTripCounter]:
    """An async client that counts its round trips."""
    counter = RoundTripCounter.connect(redis_server.url)
    yield counter
    await counter.client.aclose()


@pytest.fixture
def index(aredis: aioredis.Redis, keys: Keys) -> PrefixIndex:
    return PrefixIndex(aredis, keys)


@pytest.fixture
def registry(aredis: aioredis.Redis, keys: Keys) -> Registry:
    return Registry(aredis, keys)
