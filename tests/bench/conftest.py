"""Fixtures for the benchmark tests: a Redis server of their own (the quality bench flushes its database)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.devstack import RedisServer


@pytest.fixture(scope="module")
def bench_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()
