"""Relays an engine's KV cache events to Redis: numbered batches, one flush per loop turn.

Each batch gets the next per-worker event id and is appended to the capped ``kv-events`` stream
for observers. (The prefix index is fed from here too once KV-aware routing is on.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis

from core.keys import KV_EVENTS_STREAM_MAXLEN, Keys
from core.messages import KvEvent, KvEventBatch, encode_kv_batch

log = logging.getLogger(__name__)


class KvRelay:
    def __init__(self, client: aioredis.Redis, keys: Keys, worker_id: str, model: str) -> None:
        self._client = client
        self._keys = keys
        self.worker_id = worker_id
        self.model = model
        self.slot = -1
        self._event_id = 0
        self._pending: list[KvEvent] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, slot: int, snapshot: Callable[[], list[int]]) -> None:
        self.slot = slot
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="kv-relay")

    def push(self, events: Sequence[KvEvent]) -> None:
        self._pending.extend(events)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            events, self._pending = self._pending, []
            if not events:
                continue
            self._event_id += 1
            batch = KvEventBatch(self.worker_id, self._event_id, events)
            try:
                await self._client.xadd(self._keys.kv_events, {"b": encode_kv_batch(batch)},
                                        maxlen=KV_EVENTS_STREAM_MAXLEN, approximate=True)
            except Exception:  # noqa: BLE001
                log.exception("publishing KV events failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
