"""Feeds the Redis prefix index from the engine's KV events: numbered batches, one per loop turn.

Every event the engine reports between two turns of the relay becomes one :class:`KvEventBatch` with
the worker's next event id, applied atomically by ``PrefixIndex.apply`` (which also appends it to the
capped ``kv-events`` stream for observers). The index then lists exactly what the engine caches.

Resync: the relay replaces the worker's whole index state with the engine's cache
(``engine.cached_block_hashes()``) when it starts (go-live), when the worker registered again (its
lease was lost, e.g. Redis restarted or was flushed), when ``apply`` reports a gap (the index lost
track: a batch failed to reach Redis, the keys were flushed, the slot changed) and after any Redis
error. Events and the snapshot are taken on the engine loop, so a snapshot already includes every
event still pending; those are dropped and the batches after it continue the numbering.

On shutdown the worker's entries are purged (``close``); a worker that dies without closing is purged
by the reaper when its lease ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis

from core.keys import Keys
from core.loops import BackgroundLoop, Backoff
from core.messages import KvEvent, KvEventBatch
from router.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

#: How long the relay waits before its first retry after Redis failed it (longer while failures go on).
RETRY_DELAY_S = 0.5

Snapshot = Callable[[], list[int]]


class KvRelay:
    """One per worker, on the engine loop. ``push`` is the engine's KV sink (never blocks)."""

    def __init__(self, client: aioredis.Redis, keys: Keys, worker_id: str, model: str) -> None:
        self.index = PrefixIndex(client, keys)
        self.worker_id = worker_id
        self.model = model
        self.slot = -1
        self.event_id = 0
        self._snapshot: Snapshot = list
        self._pending: list[KvEvent] = []
        self._resync_needed = False
        self._synced: asyncio.Event | None = None
        self._idle = asyncio.Event()
        self._relay = BackgroundLoop("kv-relay", self._relay_pending, backoff=Backoff(first_s=RETRY_DELAY_S),
                                     on_error=self._failed)

    async def start(self, slot: int, snapshot: Snapshot) -> None:
        """(Re)publish the engine's whole cache at ``slot``; returns once the index holds it (or a Redis
        failure deferred it to the relay's retries). Called at go-live and after every re-registration."""
        self.slot = slot
        self._snapshot = snapshot
        self._resync_needed = True
        self._synced = asyncio.Event()
        self._relay.start()
        self._relay.wake()
        await self._synced.wait()

    def push(self, events: Sequence[KvEvent]) -> None:
        self._pending.extend(events)
        self._idle.clear()
        self._relay.wake()

    async def drained(self) -> None:
        """Wait until every event pushed so far reached the index (tests, benchmarks)."""
        await self._idle.wait()

    async def _relay_pending(self) -> None:
        # Token deltas woken in the same turn go out first: the index can wait a turn, a client
        # waiting for its first token should not.
        await asyncio.sleep(0)
        while self._resync_needed or self._pending:
            if self._resync_needed:
                await self._resync()
            else:
                await self._apply()
        self._idle.set()

    def _failed(self, exc: Exception) -> None:
        """Redis failed the relay: the batch may be lost, so the index is rebuilt from the engine."""
        self._resync_needed = True
        self._mark_synced()  # start() must not hang while Redis is away

    async def _resync(self) -> None:
        self._pending = []  # the snapshot, taken on this loop, already reflects them
        hashes = self._snapshot()
        self.event_id += 1
        self._resync_needed = False
        try:
            written = await self.index.resync(self.worker_id, self.slot, self.model, hashes, self.event_id)
        except BaseException:
            self._resync_needed = True
            raise
        log.info("KV index resynced for %s: %d blocks (event %d, slot %d)", self.worker_id, written,
                 self.event_id, self.slot)
        self._mark_synced()

    async def _apply(self) -> None:
        events, self._pending = self._pending, []
        self.event_id += 1
        result = await self.index.apply(KvEventBatch(self.worker_id, self.event_id, events),
                                        slot=self.slot, model=self.model)
        if result.needs_resync:
            log.info("KV index refused batch %d of %s (%s); resyncing", self.event_id, self.worker_id, result.status)
            self._resync_needed = True

    def _mark_synced(self) -> None:
        if self._synced is not None:
            self._synced.set()

    async def close(self) -> None:
        """Stop relaying and purge the worker's entries from the index."""
        await self._relay.stop()
        await self.index.purge(self.worker_id)
