"""Helpers for the router tests: worker factories, a round-trip counting client, polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from router.registry import LiveWorker, Registry, WorkerLoad, WorkerRecord


def make_record(worker_id: str, slot: int, *, model: str = "m", block_size: int = 4, kv_blocks: int = 1000,
                model_path: str = "/nonexistent", max_batched_tokens: int = 0, pool: str = "agg") -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id, model=model, model_path=model_path, pool=pool, queue=f"q.{worker_id}",
        pool_queue=f"q.{model}.agg", engine="mocker", block_size=block_size, kv_blocks=kv_blocks,
        max_num_seqs=64, context_length=32768, started_at=0.0, slot=slot, max_batched_tokens=max_batched_tokens)


def make_worker(worker_id: str, slot: int, *, active_blocks: int = 0, **record: Any) -> LiveWorker:
    return LiveWorker(record=make_record(worker_id, slot, **record),
                      load=WorkerLoad(active_blocks=active_blocks, total_blocks=1000),
                      lease_expires_at=time.time() + 3600)


@dataclass
class RoundTripCounter:
    """A client whose connections count the packets they send (one per command, or per pipeline) and
    their bytes."""

    client: aioredis.Redis = field(init=False)
    sends: int = 0
    sent_bytes: int = 0

    @classmethod
    def connect(cls, url: str) -> RoundTripCounter:
        counter = cls()

        class Counting(aioredis.Connection):
            async def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
                counter.sends += 1
                counter.sent_bytes += len(command) if isinstance(command, bytes | bytearray) else sum(map(len, command))
                return await super().send_packed_command(command, check_health)

        pool = aioredis.ConnectionPool.from_url(url, connection_class=Counting)
        counter.client = aioredis.Redis(connection_pool=pool)
        return counter

    async def count(self, action: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
        before = self.sends
        result = await action()
        return self.sends - before, result


async def wait_for(condition: Callable[[], Awaitable[Any]], timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Poll an async condition until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


async def wait_lease_ended(registry: Registry, worker_id: str, timeout_s: float = 10.0) -> None:
    """Wait until the worker's lease has ended by both of its clocks: the registry's listing (the expiry
    the registering process computed) and the registration's own TTL, which Redis started a moment later
    when it wrote the registration. The reaper spares a worker while its registration exists."""

    async def ended() -> bool:
        if worker_id not in await registry.expired_workers():
            return False
        return not await registry.client.exists(registry.keys.worker(worker_id))

    await wait_for(ended, timeout_s)
