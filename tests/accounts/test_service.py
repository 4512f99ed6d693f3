"""Accounts.authenticate / admit / finish against the session's real Redis and a real database:
the 401 / 403 / 429 matrix, Retry-After values, limits shared by frontend replicas, bursts, revocation
within the cache TTL, and usage shipped as Celery messages on the bookkeeping queue."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable

import msgspec
import pytest
import redis.asyncio as aioredis

from app.accounts.errors import AccountsUnavailable
from app.accounts.ratelimit import window_of
from app.accounts.schemas import KeyCreate, KeyCreated
from app.accounts.service import Accounts
from app.accounts.store import KeyStore
from core.db import open_database
from core.errors import Forbidden, InvalidRequest, RateLimited, Unauthorized
from core.keys import RATE_WINDOW_S, Keys
from core.settings import Settings
from core.wire import RECORD_USAGE_TASK
from tests.accounts.conftest import make_settings
from tests.accounts.helpers import usage_record


def new_key(accounts: Accounts, **spec: object) -> KeyCreated:
    return KeyStore(open_database(accounts.settings.database_url)).create(KeyCreate(name="t", **spec))


def bearer(key: KeyCreated | str) -> str:
    return f"Bearer {key if isinstance(key, str) else key.key}"


class WindowClock:
    """Stopped clocks in one rate window, chosen once: a test that crosses a real minute boundary
    while it runs still sees every moment it asked for in the same window."""

    def __init__(self) -> None:
        self.window_start = window_of(time.time()) * RATE_WINDOW_S

    def at(self, seconds_into_window: float) -> Callable[[], float]:
        moment = self.window_start + seconds_into_window
        return lambda: moment


async def test_auth_off_means_anonymous_and_unlimited(sqlite_url: str, redis_server, namespace: str,  # noqa: ANN001
                                                      aredis: aioredis.Redis) -> None:
    settings = Settings(database_url=sqlite_url, auth=False, redis_url=redis_server.url, namespace=namespace)
    accounts = Accounts(settings, aredis, Keys(namespace))
    assert await accounts.authenticate(None) is None
    assert await accounts.authenticate("Bearer whatever") is None
    await accounts.admit(None, "any-model", 10**9)


async def test_a_valid_key_authenticates(accounts: Accounts) -> None:
    key = new_key(accounts, models=["smollm2"], rpm=5, tpm=500, admin=True)
    principal = await accounts.authenticate(bearer(key))
    assert principal is not None
    assert (principal.key_id, principal.name, principal.is_admin) == (key.id, "t", True)
    assert (principal.models, principal.rpm, principal.tpm) == (frozenset({"smollm2"}), 5, 500)


@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer sk-sluice-nope", "Basic dXNlcjpwYXNz",
    "Bearer sk-sluice-0123456789ab-" + "x" * 43,  # well formed, unknown id
])
async def test_missing_or_unknown_keys_are_401(accounts: Accounts, header: str | None) -> None:
    with pytest.raises(Unauthorized) as caught:
        await accounts.authenticate(header)
    assert caught.value.status_code == 401


async def test_a_wrong_secret_for_a_real_key_is_401(accounts: Accounts) -> None:
    key = new_key(accounts)
    wrong = key.key[:-4] + ("AAAA" if not key.key.endswith("AAAA") else "BBBB")
    with pytest.raises(Unauthorized, match="Incorrect API key"):
        await accounts.authenticate(bearer(wrong))
    assert await accounts.authenticate(bearer(key))  # cached now; a wrong secret still fails
    with pytest.raises(Unauthorized):
        await accounts.authenticate(bearer(wrong))


async def test_revocation_is_immediate_here_and_within_the_ttl_elsewhere(accounts: Accounts, aredis: aioredis.Redis,
                                                                         namespace: str) -> None:
    """``accounts`` revokes (admin route); ``other`` is another frontend replica with its own cache."""
    settings = accounts.settings.model_copy(update={"accounts": accounts.settings.accounts.model_copy(
        update={"key_cache_ttl_s": 0.5})})
    other = Accounts(settings, aredis, Keys(namespace))
    key = new_key(accounts)
    assert await accounts.authenticate(bearer(key)) and await other.authenticate(bearer(key))
    await accounts.revoke_key(key.id)
    with pytest.raises(Unauthorized, match="revoked"):
        await accounts.authenticate(bearer(key))
    assert await other.authenticate(bearer(key))  # still trusted from its cache...
    await asyncio.sleep(0.6)
    with pytest.raises(Unauthorized, match="revoked"):  # ...but not past the TTL
        await other.authenticate(bearer(key))


async def test_concurrent_misses_share_one_database_read(accounts: Accounts, monkeypatch: pytest.MonkeyPatch) -> None:
    key = new_key(accounts)
    reads = 0
    real = accounts._key_store().get

    def counting(key_id: str):  # noqa: ANN202
        nonlocal reads
        reads += 1
        time.sleep(0.05)
        return real(key_id)

    monkeypatch.setattr(accounts._key_store(), "get", counting)
    principals = await asyncio.gather(*(accounts.authenticate(bearer(key)) for _ in range(20)))
    assert reads == 1 and all(p == principals[0] for p in principals)


async def test_a_model_the_key_may_not_use_is_403(accounts: Accounts) -> None:
    principal = await accounts.authenticate(bearer(new_key(accounts, models=["smollm2", "org/big"])))
    await accounts.admit(principal, "smollm2", 10)
    await accounts.admit(principal, "org/big", 10)
    with pytest.raises(Forbidden) as caught:
        await accounts.admit(principal, "other", 10)
    assert caught.value.status_code == 403 and caught.value.param == "model"
    unrestricted = await accounts.authenticate(bearer(new_key(accounts)))
    await accounts.admit(unrestricted, "anything/at-all", 10)


async def test_over_rpm_is_429_with_the_seconds_left_in_the_window(accounts: Accounts) -> None:
    window = WindowClock()
    principal = await accounts.authenticate(bearer(new_key(accounts, rpm=3)))
    accounts.limiter.clock = window.at(45.25)
    for _ in range(3):
        await accounts.admit(principal, "smollm2", 10)
    for _ in range(2):
        with pytest.raises(RateLimited) as caught:
            await accounts.admit(principal, "smollm2", 10)
        assert caught.value.status_code == 429 and caught.value.retry_after_s == 15
    accounts.limiter.clock = window.at(59.9)
    with pytest.raises(RateLimited) as caught:
        await accounts.admit(principal, "smollm2", 10)
    assert caught.value.retry_after_s == 1
    accounts.limiter.clock = window.at(60 + 0.5)  # the next window starts afresh
    await accounts.admit(principal, "smollm2", 10)


async def test_tokens_are_charged_at_finish_and_limit_admission(accounts: Accounts) -> None:
    window = WindowClock()
    principal = await accounts.authenticate(bearer(new_key(accounts, tpm=100)))
    accounts.limiter.clock = window.at(10.0)
    await accounts.admit(principal, "smollm2", 30)
    accounts.finish(principal, msgspec.structs.replace(usage_record(0, key_id=principal.key_id), prompt_tokens=30,
                                                      completion_tokens=50))
    await accounts.limiter.flush()
    with pytest.raises(RateLimited, match="tokens per minute") as caught:
        await accounts.admit(principal, "smollm2", 21)  # 80 charged + 21 > 100
    assert caught.value.retry_after_s == 50
    await accounts.admit(principal, "smollm2", 20)  # 80 + 20 fits exactly
    with pytest.raises(InvalidRequest) as too_big:
        await accounts.admit(principal, "smollm2", 101)  # could never fit in a minute
    assert too_big.value.status_code == 400 and too_big.value.code == "request_too_large"


async def test_limits_are_shared_by_every_frontend_replica(accounts: Accounts, aredis: aioredis.Redis,
                                                           namespace: str) -> None:
    window = WindowClock()
    replica = Accounts(accounts.settings, aredis, Keys(namespace))
    key = new_key(accounts, rpm=4)
    a, b = await accounts.authenticate(bearer(key)), await replica.authenticate(bearer(key))
    accounts.limiter.clock = replica.limiter.clock = window.at(5.0)
    await accounts.admit(a, "smollm2", 1)
    await replica.admit(b, "smollm2", 1)
    await accounts.admit(a, "smollm2", 1)
    await replica.admit(b, "smollm2", 1)
    for service, principal in ((accounts, a), (replica, b)):
        with pytest.raises(RateLimited):
            await service.admit(principal, "smollm2", 1)


async def test_a_burst_over_the_limit_gets_429s_and_nothing_else(accounts: Accounts, aredis: aioredis.Redis,
                                                                 redis_server, namespace: str) -> None:  # noqa: ANN001
    """200 concurrent requests from 4 replicas (each with its own connection pool) on a 25 rpm key."""
    window = WindowClock()
    clients = [aioredis.from_url(redis_server.url) for _ in range(3)]
    replicas = [accounts, *(Accounts(accounts.settings, c, Keys(namespace)) for c in clients)]
    key = new_key(accounts, rpm=25)
    principal = await accounts.authenticate(bearer(key))
    for replica in replicas:
        replica.limiter.clock = window.at(30.0)

    async def one(i: int) -> str:
        try:
            await replicas[i % 4].admit(principal, "smollm2", 5)
        except RateLimited as exc:
            return f"429 retry_after={exc.retry_after_s}"
        return "ok"

    outcomes = await asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True)
    for client in clients:
        await client.aclose()
    assert sorted(set(map(str, outcomes))) == ["429 retry_after=30", "ok"]
    assert outcomes.count("ok") == 25 and outcomes.count("429 retry_after=30") == 175


async def test_finish_ships_usage_in_batches_as_celery_messages(sqlite_url: str, redis_server,  # noqa: ANN001
                                                                namespace: str, aredis: aioredis.Redis,
                                                                clean_queue: str) -> None:
    settings = make_settings(sqlite_url, redis_server.url, namespace, usage_batch_max=10,
                             usage_flush_interval_s=30.0)
    accounts = Accounts(settings, aredis, Keys(namespace))
    await accounts.start()
    try:
        records = [usage_record(i) for i in range(25)]
        started = time.perf_counter()
        for record in records[:5]:
            accounts.finish(None, record)
        assert time.perf_counter() - started < 0.01  # buffering only: no I/O on the caller's path
        await asyncio.sleep(0.2)
        queued = Keys(namespace).broker_queue_list(clean_queue)
        assert await aredis.llen(queued) == 0 and accounts.usage.pending == 5  # less than a batch waits
        for record in records[5:]:
            accounts.finish(None, record)  # a full batch is waiting: the shipper wakes and pushes everything
        for _ in range(100):
            if accounts.usage.pending == 0:
                break
            await asyncio.sleep(0.02)
        assert await aredis.llen(queued) == 3
    finally:
        await accounts.close()
    messages = [json.loads(m) for m in reversed(await aredis.lrange(queued, 0, -1))]
    assert len(messages) == 3
    shipped = []
    for message in messages:
        assert message["headers"]["task"] == RECORD_USAGE_TASK
        assert message["properties"]["delivery_info"]["routing_key"] == clean_queue
        [batch], kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert kwargs == {} and len(batch) <= 10
        shipped.extend(batch)
    assert msgspec.convert(shipped, list[type(records[0])]) == records


async def test_an_uncached_key_with_the_database_down_is_503_a_cached_one_still_works(
        pg_db, redis_server, namespace: str, aredis: aioredis.Redis) -> None:  # noqa: ANN001
    from core.db.migrate import upgrade

    upgrade(pg_db.url)
    settings = make_settings(pg_db.url, redis_server.url, namespace, key_cache_ttl_s=0.2)
    accounts = Accounts(settings, aredis, Keys(namespace))
    known, unknown = new_key(accounts), new_key(accounts)
    assert await accounts.authenticate(bearer(known))
    with pg_db.outage():
        await asyncio.sleep(0.3)  # the cached answer has expired: a refresh is due and fails
        assert (await accounts.authenticate(bearer(known))).key_id == known.id
        with pytest.raises(AccountsUnavailable) as caught:
            await accounts.authenticate(bearer(unknown))
        assert caught.value.status_code == 503
    assert (await accounts.authenticate(bearer(unknown))).key_id == unknown.id
    open_database(pg_db.url).dispose()
