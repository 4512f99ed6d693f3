"""The virtual clock: jumps over idle time, fires timers in order, and stands still while Redis answers.

Each test runs its own :class:`VirtualClockLoop` (not the session's pytest-asyncio loop). The Redis tests
use blocking commands that take real time inside Redis (``BLPOP`` with a timeout: ``DEBUG SLEEP`` is
disabled on a default server), so whether the clock jumped is decided by the rule, not by how fast the
machine is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from bench.devstack import RedisServer
from bench.virtual_clock import VirtualClockConnection, VirtualClockLoop


def run(coro: Coroutine[Any, Any, Any], **loop_options: float) -> Any:
    with asyncio.Runner(loop_factory=lambda: VirtualClockLoop(**loop_options)) as runner:
        return runner.run(coro)


def test_a_long_virtual_sleep_takes_no_real_time() -> None:
    async def sleep() -> float:
        await asyncio.sleep(3 * 86400)  # longer than asyncio's longest single select timeout (one day)
        return asyncio.get_running_loop().time()

    start = time.perf_counter()
    assert run(sleep()) == pytest.approx(3 * 86400)
    assert time.perf_counter() - start < 2.0


def test_timers_fire_in_virtual_time_order_at_their_time() -> None:
    delays = [5.0, 0.5, 3.0, 0.001, 2.0, 0.25]

    async def sleepers() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[float, float]] = []

        async def sleeper(delay: float) -> None:
            await asyncio.sleep(delay)
            fired.append((delay, loop.time()))

        await asyncio.gather(*(sleeper(d) for d in delays))
        return fired

    fired = run(sleepers())
    assert [d for d, _ in fired] == sorted(delays)
    for delay, at in fired:
        assert at == pytest.approx(delay, abs=1e-9)


def test_ready_callbacks_run_before_the_clock_moves() -> None:
    async def spin() -> set[float]:
        loop = asyncio.get_running_loop()
        seen = set()
        sleeper = loop.create_task(asyncio.sleep(1.0))
        for _ in range(1000):
            seen.add(loop.time())
            await asyncio.sleep(0)
        await sleeper
        return seen

    assert run(spin()) == {0.0}


class _Connection(VirtualClockConnection):
    """Counts its Redis I/O like its parent, except the replies read while ``track_replies`` is off on
    its class (the control test: the reply the loop does not know about)."""

    track_replies = True

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if type(self).track_replies:
            return await super().read_response(*args, **kwargs)
        return await aioredis.Connection.read_response(self, *args, **kwargs)


async def _blpop_against_a_sleeper(url: str, key: str, block_s: float, *, track_reply: bool = True
                                   ) -> tuple[list[str], dict[str, float], Exception | None]:
    """BLPOP on an empty key (Redis answers after ``block_s`` real seconds, never for 0) while another
    task sleeps 1 ms of virtual time; returns who finished first, the virtual time each finished at, and
    the BLPOP's error if it failed (the client's socket timeout is 5 s)."""
    loop = asyncio.get_running_loop()
    connection = type("Connection", (_Connection,), {})
    client = aioredis.from_url(url, connection_class=connection, socket_timeout=5)
    await client.ping()  # connected before the race: only the BLPOP's reply is awaited
    connection.track_replies = track_reply
    order: list[str] = []
    at: dict[str, float] = {}
    error: Exception | None = None

    async def blocker() -> None:
        nonlocal error
        try:
            await client.blpop([key], timeout=block_s)
        except RedisTimeoutError as exc:
            error = exc
        order.append("blpop")
        at["blpop"] = loop.time()

    async def sleeper() -> None:
        await asyncio.sleep(0.001)
        order.append("sleeper")
        at["sleeper"] = loop.time()

    at["start"] = loop.time()
    await asyncio.gather(blocker(), sleeper())
    await client.aclose()
    return order, at, error


def test_the_clock_stands_still_while_a_redis_reply_is_outstanding(redis_server: RedisServer, namespace: str) -> None:
    start = time.perf_counter()
    order, at, error = run(_blpop_against_a_sleeper(redis_server.url, f"{namespace}:empty", block_s=0.2))
    real = time.perf_counter() - start
    assert error is None
    assert real >= 0.19  # Redis really held the reply for 0.2 s of real time ...
    assert at["blpop"] == at["start"]  # ... and none of it passed in virtual time,
    assert order == ["blpop", "sleeper"]  # so the 1 ms timer could only fire after the reply
    assert at["sleeper"] == pytest.approx(at["start"] + 0.001, abs=1e-9)


def test_an_untracked_connection_lets_the_clock_run_ahead(redis_server: RedisServer, namespace: str) -> None:
    """The control for the test above: a reply the loop is not told about does not hold the clock, which
    jumps over the wait, through the 1 ms timer and on to the client's 5 s socket timeout."""
    start = time.perf_counter()
    order, at, error = run(_blpop_against_a_sleeper(redis_server.url, f"{namespace}:empty", block_s=30,
                                                    track_reply=False))
    assert order == ["sleeper", "blpop"]
    assert isinstance(error, RedisTimeoutError)
    assert at["blpop"] - at["start"] == pytest.approx(5.0, abs=1e-6)
    assert time.perf_counter() - start < 20  # long before Redis would have answered


def test_a_lost_reply_cannot_hang_the_loop(redis_server: RedisServer, namespace: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """A reply that never comes (BLPOP without a timeout) freezes the clock only until the stall guard
    gives up; then the client's own socket timeout ends the call."""
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="bench.virtual_clock"):
        order, at, error = run(_blpop_against_a_sleeper(redis_server.url, f"{namespace}:empty", block_s=0),
                                    stall_s=0.3)
    real = time.perf_counter() - start
    assert isinstance(error, RedisTimeoutError)
    assert order == ["sleeper", "blpop"]
    assert at["blpop"] - at["start"] == pytest.approx(5.0, abs=1e-6)
    assert 0.3 <= real < 20
    assert "virtual clock moves on" in caplog.text


async def test_the_connection_is_a_plain_connection_on_any_other_loop(redis_server: RedisServer) -> None:
    client = aioredis.from_url(redis_server.url, connection_class=VirtualClockConnection)
    try:
        assert await client.ping()
        async with client.pipeline(transaction=False) as pipe:
            assert await pipe.ping().echo("x").execute() == [True, b"x"]
    finally:
        await client.aclose()
