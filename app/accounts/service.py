"""The frontend's accounts service (interface used by the request path).

The request path calls, in order: :meth:`Accounts.authenticate` (header -> principal),
:meth:`Accounts.admit` (model allowed? within request/token rates?) and, once the request has
ended whatever the outcome, :meth:`Accounts.finish` (never blocks: usage is written off the hot path).

Cost on the hot path: authentication reads the in-process key cache (the database only on a miss,
at most once per key per ``accounts.key_cache_ttl_s``, from a thread); admission is one Redis round
trip when the key has limits, none otherwise; finishing appends to buffers that background tasks
push to Redis. With auth off (``SLUICE_AUTH=0``) every request is anonymous: no key, no limits,
usage still recorded (``key_id`` NULL).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import redis.asyncio as aioredis

from app.accounts.apikey import parse_bearer, secret_matches
from app.accounts.errors import AccountsUnavailable
from app.accounts.keycache import KeyCache
from app.accounts.principal import Principal
from app.accounts.ratelimit import RateLimiter
from app.accounts.schemas import KeyCreate, KeyCreated, KeyInfo, UsageReport
from app.accounts.shipper import UsageShipper
from app.accounts.store import KeyStore, StoredKey
from core.accounting import UsageRecord
from core.db import DB_UNAVAILABLE, database_url, open_database
from core.db.usage import summarize_usage
from core.errors import Forbidden, Unauthorized
from core.keys import Keys
from core.settings import Settings

__all__ = ["Accounts", "Principal"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Accounts:
    def __init__(self, settings: Settings, client: aioredis.Redis, keys: Keys) -> None:
        self.settings = settings
        self.client = client
        self.keys = keys
        cfg = settings.accounts
        self._store: KeyStore | None = None
        self._store_lock = threading.Lock()
        self.key_cache: KeyCache[StoredKey] = KeyCache(
            self._load_key, ttl_s=cfg.key_cache_ttl_s, max_entries=cfg.key_cache_max_entries,
            unavailable=DB_UNAVAILABLE)
        self.limiter = RateLimiter(client, keys)
        self.usage = UsageShipper(client, keys, batch_max=cfg.usage_batch_max,
                                  interval_s=cfg.usage_flush_interval_s, buffer_max=cfg.usage_buffer_max)

    async def start(self) -> None:
        await self.limiter.start()
        await self.usage.start()

    async def close(self) -> None:
        await self.usage.close()
        await self.limiter.close()

    # --- the request path ------------------------------------------------------------------
    async def authenticate(self, authorization: str | None) -> Principal | None:
        """None when auth is off; raises core.errors.Unauthorized for a missing or wrong key."""
        if not self.settings.auth:
            return None
        presented = parse_bearer(authorization)
        try:
            stored = await self.key_cache.get(presented.key_id)
        except DB_UNAVAILABLE as exc:
            log.warning("accounts database unusable, key %s not checked: %s", presented.key_id, exc)
            raise AccountsUnavailable("API keys cannot be checked right now; try again shortly.") from exc
        if stored is None or not secret_matches(presented.secret, stored.secret_sha256):
            raise Unauthorized("Incorrect API key provided.")
        if stored.revoked:
            raise Unauthorized("This API key has been revoked.")
        return stored.principal

    async def admit(self, principal: Principal | None, model: str, prompt_tokens: int) -> None:
        """Raises Forbidden (model not allowed) or RateLimited (over rpm/tpm)."""
        if principal is None:
            return
        if not principal.may_use(model):
            raise Forbidden(f"This API key may not use model {model!r}.", param="model")
        await self.limiter.admit(principal.key_id, principal.rpm, principal.tpm, prompt_tokens)

    def finish(self, principal: Principal | None, record: UsageRecord) -> None:
        """Account the request's tokens and queue its usage row; never blocks."""
        if principal is not None and principal.tpm is not None:
            self.limiter.charge(principal.key_id, record.prompt_tokens + record.completion_tokens)
        self.usage.add(record)

    # --- key management and usage (admin routes) -------------------------------------------
    async def create_key(self, spec: KeyCreate) -> KeyCreated:
        return await self._db(lambda store: store.create(spec))

    async def list_keys(self, *, include_revoked: bool = False) -> list[KeyInfo]:
        return await self._db(lambda store: store.list_keys(include_revoked=include_revoked))

    async def key_info(self, key_id: str) -> KeyInfo:
        return await self._db(lambda store: store.info(key_id))

    async def revoke_key(self, key_id: str) -> KeyInfo:
        """Revoke in the database; this process forgets the key at once, others within the cache TTL."""
        info = await self._db(lambda store: store.revoke(key_id))
        self.key_cache.invalidate(key_id)
        return info

    async def usage_report(self, key_id: str | None, since: datetime) -> UsageReport:
        """Per-model totals of one key (``None``: the anonymous requests made with auth off)."""
        totals = await self._db(lambda store: summarize_usage(store.engine, since=since, key_ids=[key_id]))
        return UsageReport(key_id=key_id, since=since.astimezone(UTC), data=totals)

    # --- the database, always from a thread ------------------------------------------------
    def _key_store(self) -> KeyStore:
        with self._store_lock:
            if self._store is None:
                self._store = KeyStore(open_database(database_url(self.settings)))
            return self._store

    async def _load_key(self, key_id: str) -> StoredKey | None:
        return await asyncio.to_thread(lambda: self._key_store().get(key_id))

    async def _db(self, work: Callable[[KeyStore], T]) -> T:
        try:
            return await asyncio.to_thread(lambda: work(self._key_store()))
        except DB_UNAVAILABLE as exc:
            log.warning("accounts database unusable: %s", exc)
            raise AccountsUnavailable("The accounts database cannot be used right now; try again shortly.") from exc
