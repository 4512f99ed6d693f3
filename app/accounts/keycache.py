"""The frontend's in-process cache of API keys, so that authentication does not query the database
on every request.

Invariants:

* An answer (a key, or "no such key") is trusted for ``ttl_s`` after it was read; so a key revoked
  in the database stops working on every frontend within ``ttl_s`` (settings.accounts.key_cache_ttl_s).
  A revocation made through this process is seen at once (:meth:`KeyCache.invalidate`).
* Concurrent misses for the same key share one database read.
* When the database cannot be reached, an expired answer keeps being served (and retried every
  ``ttl_s``): nothing can be revoked while the database is down either. With no answer at all,
  the error propagates.
* At most ``max_entries`` answers are kept; the oldest go first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

V = TypeVar("V")


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V | None
    expires_at: float


class KeyCache(Generic[V]):
    def __init__(self, load: Callable[[str], Awaitable[V | None]], *, ttl_s: float, max_entries: int,
                 unavailable: tuple[type[Exception], ...], clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._unavailable = unavailable
        self._clock = clock
        self._entries: dict[str, _Entry[V]] = {}
        self._loading: dict[str, asyncio.Task[V | None]] = {}

    async def get(self, key_id: str) -> V | None:
        entry = self._entries.get(key_id)
        if entry is not None and entry.expires_at > self._clock():
            return entry.value
        task = self._loading.get(key_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._refresh(key_id, entry))
            self._loading[key_id] = task
            task.add_done_callback(lambda done: self._loaded(key_id, done))
        # Shielded: a caller that goes away (client disconnect) does not cancel the others' read.
        return await asyncio.shield(task)

    def _loaded(self, key_id: str, task: asyncio.Task[V | None]) -> None:
        self._loading.pop(key_id, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so an error nobody awaited is not reported as lost

    async def _refresh(self, key_id: str, stale: _Entry[V] | None) -> V | None:
        try:
            value = await self._load(key_id)
        except self._unavailable as exc:
            if stale is None:
                raise
            log.warning("accounts database unreachable, serving key %s from cache: %s", key_id, exc)
            stale.expires_at = self._clock() + self.ttl_s
            return stale.value
        self._store(key_id, value)
        return value

    def _store(self, key_id: str, value: V | None) -> None:
        self._entries.pop(key_id, None)
        while len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key_id] = _Entry(value, self._clock() + self.ttl_s)

    def invalidate(self, key_id: str) -> None:
        self._entries.pop(key_id, None)

    def clear(self) -> None:
        self._entries.clear()
