"""Sluice's Redis clients retry a command on a dropped connection, never on a late reply
(core.redis_client): a command whose reply is late was sent and may have run, and a second copy
would publish a token delta twice (the frontend saw a prefill worker's first token twice under
load), push a task twice or count a load twice."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from bench.devstack import RedisServer
from core.redis_client import redis_options
from core.redis_connection import use_bounded_send

#: A reply limit short enough that a blocked loop passes it (the clients' own is 5 s).
REPLY_LIMIT_S = 0.1


def _client(url: str) -> aioredis.Redis:
    client = aioredis.Redis.from_url(url, **{**redis_options(retries=3, backoff_cap_s=0.02),
                                             "socket_timeout": REPLY_LIMIT_S})
    use_bounded_send(client)
    return client


def _published(sub: redis.client.PubSub, until: bytes) -> list[bytes]:
    """The messages on the subscribed channel up to (not with) ``until``."""
    seen: list[bytes] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        msg = sub.get_message(timeout=1)
        if msg is None or msg["type"] != "message":
            continue
        if msg["data"] == until:
            return seen
        seen.append(msg["data"])
    raise AssertionError(f"the end marker never came (saw {seen})")


async def test_a_late_reply_fails_the_call_and_the_command_runs_once(redis_server: RedisServer) -> None:
    listener = redis.Redis.from_url(redis_server.url)
    sub = listener.pubsub()
    sub.subscribe("retry-test")
    sub.get_message(timeout=5)  # the subscription's confirmation
    client = _client(redis_server.url)
    try:
        await client.ping()  # connected: the publish below is one write and one read
        call = asyncio.create_task(client.publish("retry-test", b"delta"))
        await asyncio.sleep(0)  # the command is written; the task waits for its reply
        time.sleep(5 * REPLY_LIMIT_S)  # the process stalls (a busy machine) past the reply limit
        with pytest.raises(RedisTimeoutError):
            await call
        await client.publish("retry-test", b"end")
        assert _published(sub, until=b"end") == [b"delta"]
    finally:
        await client.aclose()
        sub.close()
        listener.close()


async def test_a_dropped_connection_is_retried_on_a_fresh_one(redis_server: RedisServer) -> None:
    client = _client(redis_server.url)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        await client.client_setname("retry-test")
        admin.client_kill_filter(_type="normal", skipme=True)  # Redis drops the pooled connection
        assert await client.incr("retry-test-n") == 1  # one retry, one increment
        assert admin.get("retry-test-n") == b"1"
    finally:
        await client.aclose()
        admin.close()
