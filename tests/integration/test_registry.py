"""Worker registry against a real Redis: leases, slots, re-registration."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from core.keys import Keys
from core.pools import Pool
from router.prefix_index import PrefixIndex
from router.reaper import reap_dead_workers
from router.registry import Registry, WorkerLoad, WorkerRecord


def record(wid: str) -> WorkerRecord:
    return WorkerRecord(worker_id=wid, model="m", model_path="/m", pool="agg", queue=f"q.{wid}", pool_queue="q",
                        engine="mocker", block_size=16, kv_blocks=100, max_num_seqs=8, context_length=1024,
                        started_at=time.time())


async def delete_namespace(client: aioredis.Redis, keys: Keys) -> None:
    """Every key of the test's namespace, and nothing else: the session's Redis is shared."""
    async for key in client.scan_iter(match=f"{keys.prefix}:*", count=1000):
        await client.delete(key)


@pytest.fixture
async def registry(redis_server, namespace):  # noqa: ANN001, ANN201
    client = aioredis.from_url(redis_server.url)
    yield Registry(client, Keys(namespace))
    await delete_namespace(client, Keys(namespace))
    await client.aclose()


async def test_register_lists_and_hands_out_distinct_slots(registry: Registry) -> None:
    a = await registry.register(record("a"), WorkerLoad(running=2), 5)
    b = await registry.register(record("b"), WorkerLoad(), 5)
    assert {a.slot, b.slot} == {0, 1}
    live = {w.record.worker_id: w for w in await registry.live_workers("m")}
    assert set(live) == {"a", "b"}
    assert live["a"].load.running == 2 and live["a"].record.queue == "q.a"
    assert await registry.live_workers("other") == []


async def test_expired_lease_drops_out_and_slot_is_recycled(registry: Registry) -> None:
    a = await registry.register(record("a"), WorkerLoad(), 0.3)
    deadline = time.monotonic() + 5
    while await registry.live_workers():
        assert time.monotonic() < deadline, "lease did not expire"
        await asyncio.sleep(0.05)
    assert await registry.expired_workers() == ["a"]
    assert await reap_dead_workers(registry, PrefixIndex(registry.client, registry.keys), grace_s=0) == ["a"]
    b = await registry.register(record("b"), WorkerLoad(), 5)
    assert b.slot == a.slot


async def test_heartbeat_reregisters_after_the_registration_vanished(registry: Registry) -> None:
    a = await registry.register(record("a"), WorkerLoad(), 5)
    assert await registry.heartbeat(a, WorkerLoad(running=1), 5) is None
    await delete_namespace(registry.client, registry.keys)  # what a Redis restart looks like to the worker
    assert await registry.client.keys(f"{registry.keys.prefix}:*") == []
    again = await registry.heartbeat(a, WorkerLoad(running=1), 5)
    assert again is not None and again.slot == 0
    assert [w.record.worker_id for w in await registry.live_workers()] == ["a"]


async def test_deregister_ends_the_lease_and_the_reaper_frees_everything(registry: Registry) -> None:
    await registry.register(record("a"), WorkerLoad(), 5)
    await registry.deregister("a")
    assert await registry.live_workers() == []
    assert await registry.expired_workers() == ["a"]
    assert await reap_dead_workers(registry, PrefixIndex(registry.client, registry.keys), grace_s=0) == ["a"]
    assert await registry.client.keys(f"{registry.keys.prefix}:*") == []


async def test_the_listing_reads_every_load_field_and_defaults_the_missing_ones(registry: Registry) -> None:
    load = WorkerLoad(running=3, waiting=1, active_blocks=40, total_blocks=512, updated_at=1.5e9, draining=True,
                      kv_resyncs=2, tokens_per_s=12.5, loras="a,b", timing="1.0,2.0,3.0,4.0,5.0,6.0", cached_blocks=300)
    a = await registry.register(record("a"), load, 5)
    [listed] = await registry.live_workers()
    assert listed.load == load and listed.record == a
    # A worker of an older release publishes fewer fields: those it lacks read as their defaults.
    await registry.client.hdel(registry.keys.load("a"), "cached_blocks", "timing", "draining")
    [listed] = await registry.live_workers()
    assert listed.load == WorkerLoad(running=3, waiting=1, active_blocks=40, total_blocks=512, updated_at=1.5e9,
                                     kv_resyncs=2, tokens_per_s=12.5, loras="a,b")
    await registry.client.delete(registry.keys.load("a"))  # the load's TTL ran out before the registration's
    [listed] = await registry.live_workers()
    assert listed.load == WorkerLoad() and listed.lease_expires_at > time.time()


async def test_the_listing_is_in_worker_id_order_whatever_the_leases(registry: Registry) -> None:
    records = {wid: await registry.register(record(wid), WorkerLoad(), 5) for wid in ("c", "a", "d", "b")}
    for wid in ("b", "d", "a", "c"):  # each heartbeat moves its worker to the end of the lease order
        await registry.heartbeat(records[wid], WorkerLoad(running=1), 5 + len(wid))
    assert [w.record.worker_id for w in await registry.live_workers()] == ["a", "b", "c", "d"]


async def test_a_worker_of_a_pool_this_release_does_not_know_is_left_out(registry: Registry,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A newer worker in the fleet during an upgrade registers a pool name older routers cannot read:
    they leave it out (and say so once) and go on routing to the others."""
    await registry.register(record("a"), WorkerLoad(), 5)
    await registry.register(record("b"), WorkerLoad(), 5)
    await registry.client.hset(registry.keys.worker("b"), "pool", "kv-cache")
    for _ in range(2):
        live = await registry.live_workers("m")
        assert [w.record.worker_id for w in live] == ["a"]
        assert live[0].record.pool is Pool.AGG
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warnings) == 1 and "'kv-cache' is not a valid Pool" in warnings[0]
