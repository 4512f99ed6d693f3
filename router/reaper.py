"""Purges the prefix-index entries of workers that are gone, then lets the registry recycle their slots.

Any process may run it, several at once (every step is idempotent): the standalone router service and
the frontends run :func:`run_reaper` in the background.

A worker is gone when its lease expired (``Registry.expired_workers``), or when the index still holds
bits for it (``kv-slots``) although it is not live: it deregistered, or its lease lapsed and was
reaped elsewhere before the purge. The owners are read before the live list, so a worker that
registers meanwhile is never taken for dead. Each sweep also drops the expired approximate-mode
guesses of the workers that stay.
"""

from __future__ import annotations

import asyncio
import logging

from router.prefix_index import PrefixIndex
from router.registry import Registry

log = logging.getLogger(__name__)


async def reap_dead_workers(registry: Registry, index: PrefixIndex) -> list[str]:
    """Purge every gone worker's index entries, then reap its registration. Returns the purged ids."""
    owners = await index.owners()
    expired = await registry.expired_workers()
    live = {w.record.worker_id for w in await registry.live_workers()}
    gone = sorted((set(owners.values()) - live) | set(expired))
    for worker_id in gone:
        cleared = await index.purge(worker_id)
        if cleared:
            log.info("purged %d index blocks of gone worker %s", cleared, worker_id)
    for worker_id in expired:
        await registry.reap(worker_id)
    await index.expire_guesses(sorted(set(owners.values()) - set(gone)))
    return gone


async def run_reaper(registry: Registry, index: PrefixIndex, interval_s: float) -> None:
    """Reap forever, every ``interval_s``; survives Redis hiccups. Cancel the task to stop it."""
    while True:
        try:
            await reap_dead_workers(registry, index)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a reaper must outlive Redis restarts
            log.exception("reaping dead workers failed")
        await asyncio.sleep(interval_s)
