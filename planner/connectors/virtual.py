"""The virtual connector: the planner decides, something else carries it out.

Each decision's replicas go to a Redis hash (``Keys.planner_targets``: ``model/pool`` -> replicas) and the
whole decision, with its reason and inputs, to the decisions stream the planner writes anyway
(``Keys.planner_decisions``). An external orchestrator reads the hash (or follows the stream) and starts
or drains workers; ``sluice planner status`` shows both.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from core.keys import Keys
from planner.connectors.base import PoolRef


class VirtualConnector:
    name = "virtual"

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.key = keys.planner_targets

    async def current(self, pool: PoolRef) -> int | None:
        raw = await self.redis.hget(self.key, str(pool))
        return int(raw) if raw is not None else None

    async def scale(self, pool: PoolRef, replicas: int, reason: str) -> None:
        await self.redis.hset(self.key, str(pool), replicas)

    async def aclose(self) -> None:
        return None

    async def targets(self) -> dict[str, int]:
        """Every pool's replicas as last decided."""
        raw = await self.redis.hgetall(self.key)
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
