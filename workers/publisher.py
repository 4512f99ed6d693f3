"""Coalescing publisher for token deltas.

Everything published during one turn of the engine loop goes out in ONE pipelined round trip,
from ONE flusher task, so deltas of a request keep their order (seq) on the wire.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

log = logging.getLogger(__name__)


class DeltaPublisher:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._pending: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="delta-publisher")

    def publish(self, channel: str, data: bytes) -> None:
        self._pending.append((channel, data))
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                await self._send(batch)
            elif self._closing:
                return

    async def _send(self, batch: list[tuple[str, bytes]]) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for channel, data in batch:
                    pipe.publish(channel, data)
                await pipe.execute()
        except Exception:  # noqa: BLE001 - the frontends will see a stalled stream; keep serving
            log.exception("publishing %d token deltas failed", len(batch))

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
