"""Fire-and-forget coroutines that are still accounted for: a reference is kept until each ends
(so the event loop cannot drop it), failures are logged, and :meth:`BackgroundTasks.drain` waits for
whatever is still running (shutdown, tests)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    def __init__(self, what: str) -> None:
        self.what = what  # named in the warning a failure logs
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def drain(self) -> None:
        """Wait until every task, including any spawned meanwhile, has ended."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s failed: %r", self.what, task.exception())
