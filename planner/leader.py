"""One acting planner per namespace: a lease in Redis (``Keys.planner_leader``) holding the acting
process's token. A second planner stands by, trying for the lease, and acts once it lapses (its holder
stopped renewing: killed, hung or cut off from Redis). The holder renews it every interval it acts in, and
checks the renewal before acting: a planner that lost the lease (Redis was away longer than the lease)
stands by again instead of acting beside its successor.

Usage::

    lease = LeaderLease(redis, keys, ttl_s=15)
    if await lease.acquire():      # or renew() once held
        ...act...
    await lease.release()
"""

from __future__ import annotations

import json
import time
import uuid

import redis.asyncio as aioredis

from core.keys import Keys
from core.lua import lua_script


class LeaderLease:
    def __init__(self, redis: aioredis.Redis, keys: Keys, ttl_s: float, metrics_url: str = "") -> None:
        """``metrics_url``: where the planner serves its metrics, kept in the lease's value (JSON:
        ``token``, ``metrics_url``, ``started_at``) for Prometheus's discovery (router.discovery)."""
        self.redis = redis
        self.key = keys.planner_leader
        self.ttl_ms = int(ttl_s * 1000)
        self.token = json.dumps({"token": uuid.uuid4().hex, "metrics_url": metrics_url, "started_at": time.time()})
        self.held = False
        self._renew = redis.register_script(lua_script("planner", "renew.lua"))
        self._release = redis.register_script(lua_script("planner", "release.lua"))

    async def acquire(self) -> bool:
        """Hold the lease: take it if nobody holds it, renew it if this process does."""
        if self.held and await self._renew(keys=[self.key], args=[self.token, self.ttl_ms]) == 1:
            return True
        self.held = bool(await self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms))
        return self.held

    async def release(self) -> None:
        if self.held:
            await self._release(keys=[self.key], args=[self.token])
            self.held = False

    async def holder(self) -> str | None:
        raw = await self.redis.get(self.key)
        return raw.decode() if isinstance(raw, bytes) else raw
