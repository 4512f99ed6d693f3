"""The frontend's worker directory against a real Redis: a worker whose lease is gone has its open
streams failed as ``worker_lost`` (so they move), but not while Redis itself was just away, when no
worker could renew its lease: then only once a lease's length has passed since Redis came back."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from app.directory import WorkerDirectory
from app.requests.streams import RequestStream, StreamHub
from bench.devstack import RedisServer
from core.keys import Keys
from router.registry import Registry, WorkerLoad
from tests.router.factories import make_record

REFRESH_S = 0.05
GRACE_S = 0.5


class Clock:
    """The directory's monotonic clock, moved by the test alone: its judgments do not depend on how
    long the real steps take on a busy machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _register(registry: Registry, worker_id: str, model_dir: Path) -> None:
    await registry.register(make_record(worker_id, -1, model_path=str(model_dir)),
                            WorkerLoad(total_blocks=1000, updated_at=time.time()), 60)


async def _refresh_once_redis_answers(directory: WorkerDirectory) -> None:
    """A refresh, tried again as the directory's own loop does while the client reconnects."""
    for _ in range(100):
        try:
            await directory.refresh()
            return
        except redis.exceptions.ConnectionError:
            await asyncio.sleep(REFRESH_S)
    raise AssertionError("Redis did not answer again")


async def _lost(stream: RequestStream) -> bool:
    """Whether the stream was ended with ``worker_lost`` (what its reader gets)."""
    try:
        batch = await stream.get_batch(0.01)
    except TimeoutError:
        return False
    return any(d.error is not None and d.error.type == "worker_lost" for d in batch)


async def test_a_lease_gone_while_redis_was_away_is_judged_only_after_a_grace(tokenizer_dir: Path) -> None:
    server = RedisServer().start()
    client = aioredis.from_url(server.url)
    try:
        keys = Keys(f"dir{uuid.uuid4().hex[:8]}")
        registry = Registry(client, keys)
        hub = StreamHub(client, keys.token_channel("f1"))
        clock = Clock()
        directory = WorkerDirectory(registry, hub, REFRESH_S, "m", lost_grace_s=GRACE_S, clock=clock)
        await _register(registry, "w1", tokenizer_dir)
        await _register(registry, "w2", tokenizer_dir)
        await directory.refresh()
        on_w1, on_w2 = hub.open("r1", "w1"), hub.open("r2", "w2")

        # Without an outage, a lease that is gone fails its streams at the next refresh.
        await registry.deregister("w2")
        clock.now += REFRESH_S
        await directory.refresh()
        assert await _lost(on_w2) and not await _lost(on_w1)

        # Redis away longer than a few refreshes, back empty (every lease lapsed).
        server._halt()
        clock.now += 2 * REFRESH_S + 1.2
        server.start()
        await client.connection_pool.disconnect()  # the connections to the old server are dead
        await _refresh_once_redis_answers(directory)
        assert "w1" not in directory.alive and not await _lost(on_w1)  # not routed to, not judged yet
        clock.now += GRACE_S / 2
        await _register(registry, "w1", tokenizer_dir)  # it renews its lease in time: its stream goes on
        await directory.refresh()
        assert "w1" in directory.alive and not await _lost(on_w1)

        # Gone for good: judged once the grace has passed.
        await registry.deregister("w1")
        await directory.refresh()
        assert not await _lost(on_w1)
        clock.now += GRACE_S
        await directory.refresh()
        assert await _lost(on_w1)

        # Redis away for a moment only (one refresh failed, no gap to speak of), back empty: a worker
        # that has not renewed its lease yet is not judged before the grace either.
        await _register(registry, "w3", tokenizer_dir)
        await directory.refresh()
        on_w3 = hub.open("r3", "w3")
        server._halt()
        clock.now += REFRESH_S
        with pytest.raises(redis.exceptions.ConnectionError):
            await directory.refresh()
        server.start()
        await client.connection_pool.disconnect()
        clock.now += REFRESH_S
        await _refresh_once_redis_answers(directory)
        assert "w3" not in directory.alive and not await _lost(on_w3)
        clock.now += GRACE_S
        await directory.refresh()
        assert await _lost(on_w3)
    finally:
        await client.aclose()
        server.stop()
