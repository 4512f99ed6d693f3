"""Feeds the Redis prefix index from the engine's KV events: numbered batches, one per loop turn.

Every event the engine reports between two turns of the relay becomes one :class:`KvEventBatch` with
the worker's next event id, applied atomically by ``PrefixIndex.apply`` (which also appends it to the
capped ``kv-events`` stream for observers). The index then lists exactly what the engine caches.

Resync: the relay replaces the worker's whole index state with the engine's cache
(``engine.cached_block_hashes()``) when it starts (go-live), and to repair the index when it lost
track of the engine (:data:`ResyncReason`): the engine lost track of its own cache (a ``KvTrackLost``
among its events: its reports had a ``gap`` or were ``undecodable``), ``apply`` ``refused`` a batch
(the index lost track: a batch failed to reach Redis, the keys were flushed, the slot changed), the
worker registered again (``lease_lost``: e.g. Redis restarted or was flushed), or a ``redis_error``
failed a step. Each repair is logged at WARNING and counted in ``sluice_kv_index_resyncs_total``
(workers.metrics), once per resync: requests that arrive while one is pending share it. Events and
the snapshot are taken on the engine loop, so a snapshot already includes every event still
pending; those are dropped and the batches after it continue the numbering.

The events of every applied batch are counted in ``sluice_worker_kv_events_published_total``.

On shutdown the worker's entries are purged (``close``); a worker that dies without closing is purged
by the reaper when its lease ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Literal, get_args

from core.keys import Keys
from core.loops import BackgroundLoop, Backoff
from core.messages import KvEvent, KvEventBatch
from core.redis_topology import IndexClient
from router.prefix_index import PrefixIndex
from workers.engines.base import EngineKvEvent, KvTrackLost
from workers.metrics import WorkerMetrics

log = logging.getLogger(__name__)

#: How long the relay waits before its first retry after Redis failed it (longer while failures go on).
RETRY_DELAY_S = 0.5

Snapshot = Callable[[], list[int]]
#: What the worker's own KV tiers hold, by tier (``Engine.tier_block_hashes``; workers.kvbm).
TierSnapshot = Callable[[], dict[str, list[int]]]


def _no_tiers() -> dict[str, list[int]]:
    return {}

#: Why the relay rebuilt the index from the engine's cache to repair it (module docstring).
ResyncReason = Literal["gap", "undecodable", "refused", "lease_lost", "redis_error"]
RESYNC_REASONS: tuple[ResyncReason, ...] = get_args(ResyncReason)


class KvRelay:
    """One per worker, on the engine loop. ``push`` is the engine's KV sink (never blocks)."""

    def __init__(self, client: IndexClient, keys: Keys, worker_id: str, model: str,
                 metrics: WorkerMetrics | None = None) -> None:
        self.index = PrefixIndex(client, keys)
        self.worker_id = worker_id
        self.model = model
        self.metrics = metrics or WorkerMetrics()
        for reason in RESYNC_REASONS:  # every reason's series exists from the start, at 0
            self.metrics.kv_index_resyncs.labels(reason)
        self.slot = -1
        self.event_id = 0
        self._snapshot: Snapshot = list
        self._tiers: TierSnapshot = _no_tiers
        self._pending: list[KvEvent] = []
        self._resync_needed = False
        #: Why the pending resync repairs the index (None: it is the go-live one, no repair).
        self._resync_reason: ResyncReason | None = None
        self._started = False
        self._synced: asyncio.Event | None = None
        self._idle = asyncio.Event()
        self._relay = BackgroundLoop("kv-relay", self._relay_pending, backoff=Backoff(first_s=RETRY_DELAY_S),
                                     on_error=self._failed)

    async def start(self, slot: int, snapshot: Snapshot, tiers: TierSnapshot = _no_tiers) -> None:
        """(Re)publish the engine's whole cache (and what its KV tiers hold, ``tiers``) at ``slot``; returns
        once the index holds it (or a Redis failure deferred it to the relay's retries). Called at go-live
        and after every re-registration."""
        self.slot = slot
        self._snapshot = snapshot
        self._tiers = tiers
        self._request_resync("lease_lost" if self._started else None)
        self._started = True
        self._synced = asyncio.Event()
        self._relay.start()
        self._relay.wake()
        await self._synced.wait()

    def push(self, events: Sequence[EngineKvEvent]) -> None:
        for event in events:
            if isinstance(event, KvTrackLost):
                self._request_resync(event.reason)
            else:
                self._pending.append(event)
        self._idle.clear()
        self._relay.wake()

    def _request_resync(self, reason: ResyncReason | None) -> None:
        """Ask for a resync; one already pending keeps its reason (and stays uncounted if it is the go-live one)."""
        if not self._resync_needed:
            self._resync_reason = reason
        self._resync_needed = True

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
        self._request_resync("redis_error")
        self._mark_synced()  # start() must not hang while Redis is away

    async def _resync(self) -> None:
        self._pending = []  # the snapshot, taken on this loop, already reflects them
        hashes = self._snapshot()
        tiers = self._tiers()
        self.event_id += 1
        reason, self._resync_reason = self._resync_reason, None
        self._resync_needed = False
        try:
            written = await self.index.resync(self.worker_id, self.slot, self.model, hashes, self.event_id,
                                              tiers=tiers)
        except BaseException:
            self._request_resync(reason)
            raise
        if reason is None:
            log.info("KV index resynced for %s: %d blocks (event %d, slot %d)", self.worker_id, written,
                     self.event_id, self.slot)
        else:
            self.metrics.kv_index_resyncs.labels(reason).inc()
            log.warning("KV index of %s rebuilt from its engine's cache (%s): %d blocks (event %d, slot %d)",
                        self.worker_id, reason, written, self.event_id, self.slot)
        self._mark_synced()

    async def _apply(self) -> None:
        events, self._pending = self._pending, []
        self.event_id += 1
        result = await self.index.apply(KvEventBatch(self.worker_id, self.event_id, events),
                                        slot=self.slot, model=self.model)
        if result.needs_resync:
            log.info("KV index refused batch %d of %s (%s); resyncing", self.event_id, self.worker_id, result.status)
            self._request_resync("refused")
        elif result.status == "ok":
            self.metrics.observe_kv_events(events)

    def _mark_synced(self) -> None:
        if self._synced is not None:
            self._synced.set()

    async def close(self) -> None:
        """Stop relaying and purge the worker's entries from the index."""
        await self._relay.stop()
        await self.index.purge(self.worker_id, self.model)
