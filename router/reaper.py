"""The one reaper: forgets workers that are gone, everywhere at once. Any process may run it, several at
once: the standalone router service and every frontend run :func:`run_reaper` in the background.

A worker is gone when its lease ended (it expired: the worker died or hangs; or the worker deregistered)
at least :data:`REAP_GRACE_S` ago and it has not registered again. For each gone worker the reaper
deletes, in atomic steps (router/lua/reap.lua), its prefix-index entries, then its own Celery queue
with the messages still in it (every priority's list, and its binding: kombu's layout under the
namespace's broker prefix, core.keys), its queue record, its registry slot and its registry entry. Deleting the queue matters: the requests in it already failed at their
frontends (their worker's lease ended), and a worker restarted under the same name must not serve them.

Candidates come from three places, so none is missed whoever reaped part of it before: the registry's
ended leases, the prefix index's slot owners, and the queue records. The liveness check is part of
each step, so the order of the reads does not matter: a worker that registers again between the
reaper's reads and its deletions keeps its queue and its index entries. Each sweep also drops the
expired approximate-mode guesses of the workers that stay.

When the routing state lives apart from the broker (core.redis_topology), no one script can reach the
registry, the index and the queue: :class:`SplitReaper` checks the lease (router/lua/forget.lua), purges
the index blocks in the model's slot, deletes the queue on the broker, then forgets the registration,
checking the lease again. A worker that registers again between the first check and the purge loses its
fresh index entries (its next KV batch finds no record, and it resyncs at once); one that registers again
in the instant between the queue's deletion and the last check may lose the tasks pushed in that
instant. Both need a worker to come back under the same name at the moment its predecessor, gone for
:data:`REAP_GRACE_S`, is reaped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from core.keys import broker_binding_member
from core.lua import lua_script
from core.redis_values import ScriptArg
from router.prefix_index import PURGE_CHUNK_BLOCKS, PrefixIndex
from router.registry import Registry, WorkerQueue

log = logging.getLogger(__name__)

#: How long after a lease ended the reaper leaves the worker alone. A frontend routes from a snapshot
#: of the live workers refreshed every ``router.registry_refresh_s`` (0.25 s), so it may still push a
#: request onto a worker's queue a moment after the lease ended; the queue is deleted after that
#: moment, with the request, instead of before it (which would leave a queue nobody deletes).
REAP_GRACE_S = 2.0

ReapStatus = Literal["spared", "done"]


@dataclass(frozen=True, slots=True)
class Reaped:
    """What reaping one worker did. ``spared``: the worker is live (again), or its lease ended less than
    the grace ago: nothing was touched."""

    worker_id: str
    status: ReapStatus
    blocks_cleared: int = 0
    messages_dropped: int = 0
    #: This reaper removed the registry entry (of several reapers racing, exactly one does).
    removed: bool = False

    @property
    def acted(self) -> bool:
        return self.status == "done" and bool(self.removed or self.blocks_cleared or self.messages_dropped)


async def reap_each(reap: Callable[[str], Awaitable[Reaped]], worker_ids: list[str]) -> list[Reaped]:
    """Reap each gone worker in turn; what was done to those fully reaped."""
    done = []
    for worker_id in worker_ids:
        reaped = await reap(worker_id)
        if reaped.status == "done":
            done.append(reaped)
        if reaped.acted:
            log.info("reaped gone worker %s: %d index blocks, %d queued messages dropped", worker_id,
                     reaped.blocks_cleared, reaped.messages_dropped)
    return done


class Reaper:
    def __init__(self, registry: Registry, index: PrefixIndex, grace_s: float = REAP_GRACE_S) -> None:
        self.registry = registry
        self.index = index
        self.grace_s = grace_s
        self._reap = registry.client.register_script(lua_script("router", "reap.lua"))

    async def reap(self, worker_id: str) -> Reaped:
        """Forget one worker, unless it is live or its lease ended less than the grace ago; idempotent."""
        k = self.registry.keys
        queue = await self.registry.worker_queue(worker_id) or WorkerQueue(k.worker_queue(worker_id), "")
        lists = k.broker_queue_lists(queue.queue)
        bindings = k.broker_binding_sets(queue.exchange) if queue.exchange else []
        keys = [k.workers, k.worker(worker_id), k.load(worker_id), k.slots, k.worker_queues,
                k.kv_worker_meta(worker_id), k.kv_worker(worker_id), k.kv_worker_approx(worker_id),
                k.kv_slot_owners, k.kv_slot_tags, *lists, *bindings]
        cleared = 0
        while True:
            ended_before = time.time() - self.grace_s
            args: list[ScriptArg] = [worker_id, ended_before, PURGE_CHUNK_BLOCKS, len(lists), broker_binding_member(queue.queue)]
            status, blocks, dropped, removed = await self._reap(keys=keys, args=args)
            cleared += int(blocks)
            status = status.decode()
            if status == "spared":
                return Reaped(worker_id, "spared", cleared)
            if status == "done":
                return Reaped(worker_id, "done", cleared, int(dropped), bool(removed))

    async def sweep(self) -> list[Reaped]:
        """Reap every gone worker; returns what was done to each candidate that was not spared."""
        owners = set((await self.index.owners()).values())
        candidates = owners | set(await self.registry.expired_workers()) | set(await self.registry.recorded_workers())
        live = {w.record.worker_id for w in await self.registry.live_workers()}
        done = await reap_each(self.reap, sorted(candidates - live))
        await self.index.expire_guesses(sorted(owners & live))
        return done


class SplitReaper(Reaper):
    """The reaper of a deployment whose routing state lives apart from the broker (see the module
    docstring): ``registry`` and ``index`` on the index Redis (a Redis Cluster, maybe), ``broker`` the
    broker's Redis, where the workers' queues are."""

    def __init__(self, registry: Registry, index: PrefixIndex, broker: aioredis.Redis,
                 grace_s: float = REAP_GRACE_S) -> None:
        super().__init__(registry, index, grace_s)
        self.broker = broker
        self._forget = registry.client.register_script(lua_script("router", "forget.lua"))
        #: worker -> model, for gone workers found in a model's slot owners but with no queue record.
        self._models: dict[str, str] = {}

    async def _registry_step(self, worker_id: str, forget: bool) -> tuple[str, bool]:
        k = self.registry.keys
        keys = [k.workers, k.worker(worker_id), k.load(worker_id), k.slots, k.worker_queues]
        status, removed = await self._forget(keys=keys, args=[worker_id, time.time() - self.grace_s, int(forget)])
        return status.decode(), bool(removed)

    async def _drop_queue(self, queue: WorkerQueue) -> int:
        k = self.registry.keys
        lists = k.broker_queue_lists(queue.queue)
        async with self.broker.pipeline(transaction=True) as pipe:
            for name in lists:
                pipe.llen(name)
            pipe.delete(*lists)
            for binding in (k.broker_binding_sets(queue.exchange) if queue.exchange else []):
                pipe.srem(binding, broker_binding_member(queue.queue))
            replies = await pipe.execute()
        return sum(int(n) for n in replies[: len(lists)])

    async def reap(self, worker_id: str) -> Reaped:
        if (await self._registry_step(worker_id, forget=False))[0] == "spared":
            return Reaped(worker_id, "spared")
        k = self.registry.keys
        queue = await self.registry.worker_queue(worker_id) or WorkerQueue(k.worker_queue(worker_id), "")
        model = queue.model or self._models.get(worker_id)
        cleared = await self.index.purge(worker_id, model) if model or not k.hash_tags else 0
        dropped = await self._drop_queue(queue)
        status, removed = await self._registry_step(worker_id, forget=True)
        if status == "spared":
            log.warning("worker %s registered again while it was being reaped", worker_id)
            return Reaped(worker_id, "spared", cleared)
        return Reaped(worker_id, "done", cleared, dropped, removed)

    async def sweep(self) -> list[Reaped]:
        records = await self.registry.worker_queues()
        live_workers = await self.registry.live_workers()
        live = {w.record.worker_id for w in live_workers}
        models = {q.model for q in records.values() if q.model} | {w.record.model for w in live_workers}
        # With hash tags every model's index has its own slot owners; without, one map serves them all.
        groups: list[str | None] = [m for m in sorted(models)] if self.registry.keys.hash_tags else [None]
        owners_by_model = {m: set((await self.index.owners(m)).values()) for m in groups}
        self._models = {wid: m for m, owners in owners_by_model.items() if m for wid in owners}
        owners = set().union(*owners_by_model.values())
        candidates = owners | set(await self.registry.expired_workers()) | set(records)
        done = await reap_each(self.reap, sorted(candidates - live))
        for model, model_owners in owners_by_model.items():
            await self.index.expire_guesses(sorted(model_owners & live), model)
        return done


def make_reaper(registry: Registry, index: PrefixIndex, broker: aioredis.Redis | None = None,
                grace_s: float = REAP_GRACE_S) -> Reaper:
    """The reaper for the layout: one script per step when the broker holds the routing state too
    (``broker`` None or the registry's own client), :class:`SplitReaper` when it does not."""
    if broker is None or broker is registry.client:
        return Reaper(registry, index, grace_s)
    return SplitReaper(registry, index, broker, grace_s)


async def reap_dead_workers(registry: Registry, index: PrefixIndex, *, grace_s: float = REAP_GRACE_S,
                            broker: aioredis.Redis | None = None) -> list[str]:
    """One sweep (:meth:`Reaper.sweep`); returns the ids of the workers this call reaped something of."""
    return [r.worker_id for r in await make_reaper(registry, index, broker, grace_s).sweep() if r.acted]


async def run_reaper(registry: Registry, index: PrefixIndex, interval_s: float, *,
                     grace_s: float = REAP_GRACE_S, broker: aioredis.Redis | None = None) -> None:
    """Reap forever, every ``interval_s``; survives Redis hiccups. Cancel the task to stop it."""
    reaper = make_reaper(registry, index, broker, grace_s)
    while True:
        try:
            await reaper.sweep()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a reaper must outlive Redis restarts
            log.exception("reaping dead workers failed")
        await asyncio.sleep(interval_s)
