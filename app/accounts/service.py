"""The frontend's accounts service (interface used by the request path).

The request path calls, in order: :meth:`Accounts.authenticate` (header -> principal),
:meth:`Accounts.admit` (model allowed? within request/token rates?) and, once the request has
ended whatever the outcome, :meth:`Accounts.finish` (never blocks: usage is written off the hot path).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from core.accounting import UsageRecord
from core.keys import Keys
from core.settings import Settings


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    name: str
    is_admin: bool = False


class Accounts:
    def __init__(self, settings: Settings, client: aioredis.Redis, keys: Keys) -> None:
        self.settings = settings
        self.client = client
        self.keys = keys

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def authenticate(self, authorization: str | None) -> Principal | None:
        """None when auth is off; raises core.errors.Unauthorized for a missing or wrong key."""
        return None

    async def admit(self, principal: Principal | None, model: str, prompt_tokens: int) -> None:
        """Raises Forbidden (model not allowed) or RateLimited (over rpm/tpm)."""

    def finish(self, principal: Principal | None, record: UsageRecord) -> None:
        """Account the request's tokens and queue its usage row; never blocks."""
