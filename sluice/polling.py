"""What the commands that read a running deployment share (``sluice status``, ``sluice
prometheus-targets``): a Redis client for the namespace, and doing one step once or every few
seconds until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import redis.asyncio as aioredis

from core.keys import Keys
from core.redis_client import background_client
from core.settings import Settings


@contextlib.asynccontextmanager
async def namespace_client(settings: Settings) -> AsyncIterator[tuple[aioredis.Redis, Keys]]:
    client = background_client(settings.redis.url)
    try:
        yield client, Keys(settings.redis.namespace)
    finally:
        await client.aclose()


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
