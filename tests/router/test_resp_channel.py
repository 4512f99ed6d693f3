"""The routing hot path's own Redis connection, against a real Redis server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from bench.devstack import RedisServer
from router.resp import pack_command
from router.resp_channel import PackedScript, RespChannel
from tests.router.factories import RoundTripCounter


@pytest.fixture
async def private_redis() -> AsyncIterator[RedisServer]:
    """A server of the test's own, which the test may restart."""
    server = RedisServer().start()
    yield server
    server.stop()


def echo(text: str) -> bytes:
    return pack_command("ECHO", text)


async def test_concurrent_calls_each_get_their_own_replies(aredis: aioredis.Redis) -> None:
    channel = RespChannel(aredis)
    assert channel.direct

    async def call(i: int) -> list[bytes]:
        return await channel.call(echo(f"a{i}") + echo(f"b{i}" * (i % 7 + 1) * 1000), 2)

    replies = await asyncio.gather(*(call(i) for i in range(200)))
    assert replies == [[f"a{i}".encode(), (f"b{i}" * (i % 7 + 1) * 1000).encode()] for i in range(200)]
    assert channel.writes == 200  # one write per call: one round trip
    await channel.aclose()


async def test_error_replies_are_raised_and_the_connection_stays_usable(aredis: aioredis.Redis,
                                                                        namespace: str) -> None:
    channel = RespChannel(aredis)
    with pytest.raises(NoScriptError):
        await channel.call(pack_command("EVALSHA", "0" * 40, 0), 1)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        key = f"sluice:{namespace}:list"
        await channel.call(pack_command("LPUSH", key, "x") + pack_command("GET", key), 2)
    assert await channel.call(echo("still here"), 1) == [b"still here"]
    await channel.aclose()


async def test_a_cancelled_call_does_not_shift_the_replies_of_the_next(aredis: aioredis.Redis,
                                                                     namespace: str) -> None:
    channel = RespChannel(aredis)
    await channel.call(echo("connect"), 1)
    # BLPOP on an empty list answers (nil) only after its 1 s timeout: the call is still waiting
    # when it is cancelled, and the next call's command queues behind it on the connection.
    slow = asyncio.ensure_future(channel.call(pack_command("BLPOP", f"sluice:{namespace}:empty", "1")
                                              + echo("slow"), 2))
    await asyncio.sleep(0.05)
    slow.cancel()
    assert await channel.call(echo("next"), 1) == [b"next"]
    assert slow.cancelled()
    await channel.aclose()


async def test_scripts_load_on_first_use(aredis: aioredis.Redis) -> None:
    channel = RespChannel(aredis)
    script = PackedScript(channel, "return {KEYS[1], ARGV[1], #ARGV}")
    await aredis.script_flush()
    assert await script(["k"], [b"v", 3]) == [b"k", b"v", 2]
    assert await script(["k2"], ["w"]) == [b"k2", b"w", 1]
    await channel.aclose()


async def test_the_connection_is_reopened_after_redis_restarts(private_redis: RedisServer) -> None:
    client = aioredis.from_url(private_redis.url)
    channel = RespChannel(client)
    assert await channel.call(echo("before"), 1) == [b"before"]
    private_redis.restart()
    assert await channel.call(echo("after"), 1) == [b"after"]  # sent again on a fresh connection
    await channel.aclose()
    await client.aclose()


async def test_database_and_password_come_from_the_client(private_redis: RedisServer) -> None:
    admin = aioredis.from_url(private_redis.url)
    await admin.config_set("requirepass", "s3cret")
    try:
        client = aioredis.from_url(f"redis://:s3cret@127.0.0.1:{private_redis.port}/3")
        channel = RespChannel(client)
        await channel.call(pack_command("SET", "k", "in db 3"), 1)
        assert await client.get("k") == b"in db 3"
        wrong = RespChannel(aioredis.from_url(f"redis://:nope@127.0.0.1:{private_redis.port}/0"))
        with pytest.raises(ResponseError):
            await wrong.call(echo("x"), 1)
        await channel.aclose()
        await wrong.aclose()
        await client.aclose()
    finally:
        await admin.execute_command("AUTH", "s3cret")
        await admin.config_set("requirepass", "")
        await admin.aclose()


async def test_a_connection_class_it_cannot_reproduce_goes_through_the_pool(counter: RoundTripCounter) -> None:
    channel = RespChannel(counter.client)
    assert not channel.direct
    await channel.call(echo("connect"), 1)  # the pool's connection says hello first
    sends, replies = await counter.count(lambda: channel.call(echo("a") + echo("b"), 2))
    assert (sends, replies, channel.writes) == (1, [b"a", b"b"], 2)
    with pytest.raises(NoScriptError):
        await channel.call(pack_command("EVALSHA", "0" * 40, 0), 1)
    assert await channel.call(echo("c"), 1) == [b"c"]
