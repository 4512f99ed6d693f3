"""Enqueueing task messages: every LPUSH issued during one event-loop turn goes to Redis in ONE
pipelined round trip. Each caller still awaits its own push, so a failed enqueue is that
request's error (a 503), never a silent loss. A queue's messages live in its Redis list under the
namespace's broker prefix (core.keys), where the namespace's Celery workers look for them."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from core.errors import NoWorkerAvailable
from core.keys import Keys


class Enqueuer:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._pending: list[tuple[str, bytes, asyncio.Future[None]]] = []
        self._scheduled = False

    async def push(self, queue: str, message: bytes) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append((queue, message, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        await fut

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            asyncio.get_running_loop().create_task(self._send(batch))

    async def _send(self, batch: list[tuple[str, bytes, asyncio.Future[None]]]) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for queue, message, _ in batch:
                    pipe.lpush(self._keys.broker_queue_list(queue), message)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - every waiting request gets the error
            error = NoWorkerAvailable(f"could not enqueue the request: {exc}")
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(error)
            return
        for _, _, fut in batch:
            if not fut.done():
                fut.set_result(None)
