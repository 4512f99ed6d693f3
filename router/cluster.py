"""A snapshot of one namespace as Redis holds it: the live workers with their load, the live
frontends, how many tasks wait in each queue and how many blocks the prefix index lists per worker.

What ``sluice status`` shows, what the frontend's ``/metrics`` reports about queues and the index,
and what the Prometheus discovery lists (router.discovery). :meth:`ClusterReader.read` takes it in six
calls, three round trips one after the other, whatever the size of the deployment: the two registries
(two calls each, concurrently), then the queue lengths and the index sizes (one pipeline each,
concurrently).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis

from core.keys import Keys
from core.redis_topology import RedisPlanes
from router.frontends import FrontendRegistry, LiveFrontend
from router.prefix_index import PrefixIndex
from router.queues import queue_depths
from router.registry import LiveWorker, Registry


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    namespace: str
    #: When it was read (unix seconds).
    taken_at: float
    workers: list[LiveWorker]
    frontends: list[LiveFrontend]
    #: Messages waiting per Celery queue: each live worker's pool queue and own queue.
    queue_messages: dict[str, int]
    #: Blocks the prefix index lists per live worker (its KV events, or the routers' guesses).
    index_blocks: dict[str, int]

    def pool_queues(self) -> dict[tuple[str, str], str]:
        """(model, pool) -> the pool's shared queue, for every pool with a live worker."""
        return {(w.record.model, w.record.pool): w.record.pool_queue for w in self.workers}

    def models(self) -> list[str]:
        return sorted({w.record.model for w in self.workers})


async def _no_sizes() -> dict[str, int]:
    return {}


def watched_queues(workers: Iterable[LiveWorker]) -> list[str]:
    """Every queue the workers take tasks from: their pools' queues and their own."""
    return list(dict.fromkeys(q for w in workers for q in (w.record.pool_queue, w.record.queue)))


class ClusterReader:
    """Takes snapshots of one namespace; holds its registries and index handle for repeated reads."""

    def __init__(self, client: aioredis.Redis, keys: Keys, *, registry: Registry | None = None,
                 index: PrefixIndex | None = None) -> None:
        """``client``: the broker's Redis (queues, frontends); ``registry`` and ``index`` may live on the
        index Redis (core.redis_topology), and default to the broker's."""
        self.client = client
        self.keys = keys
        self.registry = registry or Registry(client, keys)
        self.frontends = FrontendRegistry(client, keys)
        self.index = index or PrefixIndex(client, keys)

    @classmethod
    def of(cls, planes: RedisPlanes) -> ClusterReader:
        """A reader of the deployment ``planes`` reach, with a registry of its own (:meth:`aclose` closes it):
        the frontends and the queues on the broker, the registry and the index on the routing state's Redis."""
        keys = planes.topology.keys
        return cls(planes.broker, keys, registry=Registry(planes.index, keys), index=PrefixIndex(planes.index, keys))

    async def aclose(self) -> None:
        """Close the registry's own connection (for a reader made by :meth:`of`; the clients are the caller's)."""
        await self.registry.aclose()

    async def read(self, extra_queues: Iterable[str] = (), index: bool = True) -> ClusterSnapshot:
        """``extra_queues``: more queues to count with the workers' own (a pool without a live worker has
        none in ``watched_queues``); ``index``: whether to read the index sizes (False: ``index_blocks`` is
        empty, one round trip fewer)."""
        workers, frontends = await asyncio.gather(self.registry.live_workers(), self.frontends.live())
        depths, sizes = await asyncio.gather(
            queue_depths(self.client, self.keys, [*watched_queues(workers), *extra_queues]),
            self._index_sizes(workers) if index else _no_sizes())
        return ClusterSnapshot(namespace=self.keys.namespace, taken_at=time.time(),
                               workers=sorted(workers, key=lambda w: w.record.worker_id),
                               frontends=sorted(frontends, key=lambda f: f.record.frontend_id),
                               queue_messages=depths, index_blocks=sizes)

    async def _index_sizes(self, workers: list[LiveWorker]) -> dict[str, int]:
        """Index sizes, read per model (with hash tags each model's index is on its own shard)."""
        by_model: dict[str, list[str]] = {}
        for w in workers:
            by_model.setdefault(w.record.model, []).append(w.record.worker_id)
        sizes: dict[str, int] = {}
        for part in await asyncio.gather(*(self.index.sizes(ids, model) for model, ids in by_model.items())):
            sizes.update(part)
        return sizes
