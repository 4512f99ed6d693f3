"""What the commands that read a running deployment share (``sluice status``, ``sluice
prometheus-targets``): clients of the deployment's Redis planes, and doing one step once or every few
seconds until Ctrl-C.

The commands read what the frontends read, where they read it (core.redis_topology): the frontends'
leases and the Celery queues on the broker's Redis, the worker registry and the prefix index on the
routing state's Redis, which is the broker's unless ``SLUICE_INDEX_REDIS_URL`` moves it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import Settings


@contextlib.asynccontextmanager
async def deployment_planes(settings: Settings) -> AsyncIterator[RedisPlanes]:
    """Clients of the broker's Redis and of the routing state's (one client when they are one Redis)."""
    planes = RedisPlanes.open(RedisTopology.from_settings(settings.redis), "background")
    try:
        yield planes
    finally:
        await planes.aclose()


def redis_names(topology: RedisTopology) -> str:
    """The Redis a command reads, for its error messages."""
    if not topology.split:
        return topology.broker_url
    cluster = ", Redis Cluster" if topology.index_cluster else ""
    return f"{topology.broker_url} (broker) or {topology.index_url} (routing state{cluster})"


async def repeat(step: Callable[[], Awaitable[bool]], interval_s: float | None) -> int:
    """Run ``step`` once, or every ``interval_s`` until interrupted; ``step`` says whether it succeeded
    (a failure is its to report). The exit status of a single run: 0, or 1 when it failed."""
    while True:
        ok = await step()
        if interval_s is None:
            return 0 if ok else 1
        await asyncio.sleep(interval_s)


def run_until_interrupted(main: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run(main)``; Ctrl-C ends it with status 0 (how a ``--watch`` stops)."""
    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        return 0
