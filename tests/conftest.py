"""Session fixtures shared by every test package: a private Redis server and per-test namespaces."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from sluice.devstack import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test: every key the test makes lives under it."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_client(redis_server: RedisServer, namespace: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    for key in client.scan_iter(match=f"sluice:{namespace}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def tokenizer_dir():  # noqa: ANN201
    """The default model's tokenizer-only directory (prepared once into the user cache)."""
    from core.settings import Settings
    from workers.models.prepare import prepare_model

    return prepare_model("smollm2", Settings().models_dir, weights=False, progress=False)
