"""Sluice's Redis clients deliver every cancellation (core.redis_connection): a task cancelled at any
point of a command, a pipeline or a script call ends with ``CancelledError``, and the client still
works afterwards. redis-py's own connections lose most such cancellations on Python 3.11; the check
below that they do keeps this test able to fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from core.redis_connection import BoundedSend
from core.redis_topology import plain_client
from tests.support.redis_topologies import SentinelGroup

#: Loop turns to cancel after: 0 .. TURNS-1 covers every suspension point of one command and its
#: reply on a loopback Redis (a command takes fewer than ten turns).
TURNS = 24

Op = Callable[[aioredis.Redis], Awaitable[object]]


async def _get(client: aioredis.Redis) -> object:
    return await client.get("cancel-test")


async def _pipeline(client: aioredis.Redis) -> object:
    async with client.pipeline(transaction=True) as pipe:
        pipe.set("cancel-test", 1)
        pipe.pexpire("cancel-test", 10_000)
        return await pipe.execute()


async def _script(client: aioredis.Redis) -> object:
    return await client.eval("return redis.call('INCR', KEYS[1])", 1, "cancel-test-n")


async def lost_cancellations(client: aioredis.Redis, op: Op, rounds: int = 3, *, first_only: bool = False) -> list[int]:
    """The loop turns after which a cancel of a task running ``op`` in a loop was lost (the task
    went on running it); ``first_only``: stop at the first one lost."""

    async def repeat() -> None:
        while True:
            await op(client)

    lost = []
    for _ in range(rounds):
        for turns in range(TURNS):
            task = asyncio.create_task(repeat())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=1)
            if done and task.cancelled():
                continue
            lost.append(turns)
            while not task.done():  # a cancel lost again leaves it running: cancel until one lands
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
            if first_only:
                return lost
    return lost


@pytest.fixture
async def background(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = plain_client(redis_server.url, "background")
    yield client
    await client.aclose()


@pytest.fixture
async def frontend(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = plain_client(redis_server.url, "frontend", max_connections=8)
    yield client
    await client.aclose()


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    with SentinelGroup().start() as group:
        yield group


@pytest.mark.parametrize("op", [_get, _pipeline, _script], ids=["command", "pipeline", "script"])
async def test_a_background_client_delivers_every_cancel(background: aioredis.Redis, op: Op) -> None:
    assert await lost_cancellations(background, op) == []
    assert await background.ping()
    assert isinstance(await background.connection_pool.get_connection(), BoundedSend)


@pytest.mark.parametrize("op", [_get, _pipeline], ids=["command", "pipeline"])
async def test_the_frontends_client_delivers_every_cancel(frontend: aioredis.Redis, op: Op) -> None:
    assert await lost_cancellations(frontend, op) == []
    assert await frontend.ping()


async def test_a_sentinel_managed_client_delivers_every_cancel(sentinel_group: SentinelGroup) -> None:
    client = plain_client(sentinel_group.url, "background", master_name=sentinel_group.master_name)
    try:
        assert await lost_cancellations(client, _get, rounds=1) == []
        assert await client.set("after", 1)
    finally:
        await client.aclose()


async def test_redis_pys_own_connections_lose_cancels(redis_server: RedisServer) -> None:
    """What the bounded write is for (the same client with it: the tests above); if a redis-py release
    stops losing them, core.redis_connection can go, and this test tells."""
    client = aioredis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        assert not isinstance(client.connection_pool.make_connection(), BoundedSend)
        assert await lost_cancellations(client, _get, rounds=1, first_only=True) != []
    finally:
        await client.aclose()
