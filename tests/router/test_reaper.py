"""Reaping gone workers against a real Redis: lease expiry, clean deregistration, slot reuse without
stale bits, the worker's own queue, workers back under their name, reapers racing each other, and a
worker of the same name in another namespace on the same Redis, never touched."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import redis
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from core.keys import Keys, broker_binding_member
from router.prefix_index import PURGE_CHUNK_BLOCKS, PrefixIndex, owner_tag
from router.reaper import Reaped, Reaper, reap_dead_workers
from router.registry import Registry, WorkerLoad, WorkerRecord
from tests.router.factories import make_record, wait_lease_ended

CHAIN = [11, 12, 13, 14]


async def _register(registry: Registry, worker_id: str, ttl_s: float):  # type: ignore[no-untyped-def]
    return await registry.register(make_record(worker_id, -1), WorkerLoad(updated_at=time.time()), ttl_s)


async def test_expired_worker_is_purged_and_its_slot_comes_back_clean(registry: Registry, index: PrefixIndex) -> None:
    # The live worker first: registered after a 0.3 s lease ran out (a slow machine), it would take
    # the dead worker's slot, which is another test's case (test_slot_taken_before_the_reaper_ran).
    alive = await _register(registry, "alive", ttl_s=60)
    dead = await _register(registry, "dead", ttl_s=0.3)
    await index.resync("dead", dead.slot, "m", CHAIN, 0)
    await index.resync("alive", alive.slot, "m", CHAIN[:2], 0)

    await wait_lease_ended(registry, "dead")  # the lease runs out: no heartbeat came
    assert await reap_dead_workers(registry, index, grace_s=0) == ["dead"]
    assert await index.overlaps("m", CHAIN, [dead.slot, alive.slot]) == {dead.slot: 0, alive.slot: 2}
    assert await index.owners() == {alive.slot: "alive"}
    assert await registry.expired_workers() == []

    fresh = await _register(registry, "fresh", ttl_s=60)
    assert fresh.slot == dead.slot  # the slot is recycled...
    read = await index.read("m", [CHAIN], [fresh.slot])
    assert read.overlaps[0].tolist() == [0] and read.tags.tolist() == [0]  # ...without the dead worker's bits
    assert await reap_dead_workers(registry, index, grace_s=0) == []


async def test_slot_taken_before_the_reaper_ran(registry: Registry, index: PrefixIndex) -> None:
    dead = await _register(registry, "dead", ttl_s=0.3)
    await index.resync("dead", dead.slot, "m", CHAIN, 0)
    await wait_lease_ended(registry, "dead")
    taker = await _register(registry, "taker", ttl_s=60)  # the registry hands out a slot whose lease ended
    assert taker.slot == dead.slot
    read = await index.read("m", [CHAIN], [taker.slot])
    assert read.tags.tolist() == [owner_tag("dead")]  # routers see the bits are not the taker's: ignored
    await index.resync("taker", taker.slot, "m", [99], 0)  # purges the dead owner first
    assert await index.overlaps("m", CHAIN, [taker.slot]) == {taker.slot: 0}
    assert await index.overlaps("m", [99], [taker.slot]) == {taker.slot: 1}
    assert await reap_dead_workers(registry, index, grace_s=0) == ["dead"]  # the registry entry still goes
    assert await index.overlaps("m", [99], [taker.slot]) == {taker.slot: 1}


async def test_deregistered_worker_is_purged(registry: Registry, index: PrefixIndex) -> None:
    w = await _register(registry, "w", ttl_s=60)
    await index.resync("w", w.slot, "m", CHAIN, 0)
    await registry.deregister("w")  # a clean shutdown that forgot the index
    assert await reap_dead_workers(registry, index, grace_s=0) == ["w"]
    assert await index.overlaps("m", CHAIN, [w.slot]) == {w.slot: 0}


async def test_live_workers_are_left_alone(registry: Registry, index: PrefixIndex) -> None:
    w = await _register(registry, "w", ttl_s=60)
    await index.resync("w", w.slot, "m", CHAIN, 0)
    assert await reap_dead_workers(registry, index, grace_s=0) == []
    assert await index.overlaps("m", CHAIN, [w.slot]) == {w.slot: 4}


# ---- the worker's own queue ------------------------------------------------------------------------
# A worker's queue is a Celery queue in kombu's Redis layout under the namespace's broker prefix (core.keys:
# Keys.broker_*); the reaper deletes it with the worker, unless the worker is live. Being under the
# namespace's prefix, the test's broker keys go with the others when ``redis_client`` cleans up.


async def _register_with_queue(registry: Registry, worker_id: str, ttl_s: float) -> WorkerRecord:
    k = registry.keys
    record = replace(make_record(worker_id, -1), queue=k.worker_queue(worker_id), pool_queue=k.pool_queue("m", "agg"))
    return await registry.register(record, WorkerLoad(updated_at=time.time()), ttl_s)


def _fill_queue(client: redis.Redis, keys: Keys, record: WorkerRecord, messages: int) -> None:
    """What a frontend enqueues (LPUSH, priority 0) and what Celery with priorities would (the other lists),
    and the binding a worker's consumer declares."""
    lists = keys.broker_queue_lists(record.queue)
    for i in range(messages):
        client.lpush(lists[i % len(lists)], f"task {i}")
    for key in keys.broker_binding_sets(record.pool_queue):
        client.sadd(key, broker_binding_member(record.queue))


def _queue_state(client: redis.Redis, keys: Keys, record: WorkerRecord) -> tuple[int, bool]:
    """Messages in the queue's lists, and whether it is still bound."""
    bound = any(client.sismember(key, broker_binding_member(record.queue))
                for key in keys.broker_binding_sets(record.pool_queue))
    return sum(client.llen(k) for k in keys.broker_queue_lists(record.queue)), bound


def _worker_keys(client: redis.Redis, keys: Keys, worker_id: str) -> list[bytes]:
    """Every key that names the worker (its broker keys included: they are under the namespace's prefix)."""
    return sorted(client.scan_iter(match=f"{keys.prefix}:*{worker_id}*", count=1000))


async def test_a_dead_workers_queue_goes_with_it(registry: Registry, index: PrefixIndex, redis_client: redis.Redis,
                                                 keys: Keys) -> None:
    dead = await _register_with_queue(registry, "dead", ttl_s=0.3)
    await index.resync("dead", dead.slot, "m", CHAIN, 0)
    _fill_queue(redis_client, keys, dead, messages=7)
    assert _queue_state(redis_client, keys, dead) == (7, True)
    await wait_lease_ended(registry, "dead")

    (reaped,) = await Reaper(registry, index, grace_s=0).sweep()
    assert reaped == Reaped("dead", "done", blocks_cleared=len(CHAIN), messages_dropped=7, removed=True)
    assert _queue_state(redis_client, keys, dead) == (0, False)
    assert _worker_keys(redis_client, keys, "dead") == []
    assert not redis_client.hexists(keys.slots, dead.slot) and not redis_client.zscore(keys.workers, "dead")
    assert await registry.recorded_workers() == [] and await index.owners() == {}
    assert await Reaper(registry, index, grace_s=0).sweep() == []


async def test_a_live_workers_queue_is_never_touched(registry: Registry, index: PrefixIndex, redis_client: redis.Redis,
                                                     keys: Keys) -> None:
    live = await _register_with_queue(registry, "live", ttl_s=60)
    await index.resync("live", live.slot, "m", CHAIN, 0)
    _fill_queue(redis_client, keys, live, messages=5)
    reaper = Reaper(registry, index, grace_s=0)
    assert await reaper.sweep() == []
    assert await reaper.reap("live") == Reaped("live", "spared")  # even when asked by name
    assert _queue_state(redis_client, keys, live) == (5, True)
    assert await index.overlaps("m", CHAIN, [live.slot]) == {live.slot: len(CHAIN)}
    assert [w.record.worker_id for w in await registry.live_workers()] == ["live"]


async def test_a_worker_back_under_its_name_keeps_its_queue(registry: Registry, index: PrefixIndex,
                                                            redis_client: redis.Redis, keys: Keys) -> None:
    """The reaper read the worker as gone; the worker registers again before the reaper's deletion: the
    deletion checks the lease in the same atomic step, and spares it."""
    old = await _register_with_queue(registry, "w", ttl_s=0.3)
    await wait_lease_ended(registry, "w")
    reaper = Reaper(registry, index, grace_s=0)
    assert "w" in await registry.expired_workers()  # what a sweep reads first...

    # ...then the worker's claim starts a lease before its registration is written (claim_slot.lua)...
    redis_client.zadd(registry.keys.workers, {"w": time.time() + 60})
    assert await reaper.reap("w") == Reaped("w", "spared")
    # ...and once written, the registration itself keeps the reaper away.
    again = await _register_with_queue(registry, "w", ttl_s=60)
    assert again.slot == old.slot
    _fill_queue(redis_client, keys, again, messages=3)
    assert await reaper.reap("w") == Reaped("w", "spared")
    assert await reaper.sweep() == []
    assert _queue_state(redis_client, keys, again) == (3, True)


async def test_a_lease_that_ended_a_moment_ago_is_spared_for_the_grace(registry: Registry, index: PrefixIndex,
                                                                      redis_client: redis.Redis, keys: Keys) -> None:
    """A frontend's snapshot may still route to a worker whose lease just ended: its queue is deleted
    after the grace, with whatever was pushed meanwhile."""
    w = await _register_with_queue(registry, "w", ttl_s=60)
    await registry.deregister("w")
    assert await registry.expired_workers() == ["w"]
    _fill_queue(redis_client, keys, w, messages=2)  # pushed from a snapshot taken before the deregistration
    assert await Reaper(registry, index, grace_s=60).sweep() == []
    assert _queue_state(redis_client, keys, w) == (2, True)
    assert [r.messages_dropped for r in await Reaper(registry, index, grace_s=0).sweep()] == [2]
    assert _queue_state(redis_client, keys, w) == (0, False)


async def test_reapers_racing_each_other(redis_server: RedisServer, registry: Registry, index: PrefixIndex,
                                         redis_client: redis.Redis, keys: Keys) -> None:
    """Four reapers in four connections sweep at once, again and again, over a dead worker whose index
    takes several steps to purge, next to a live worker: the dead one is forgotten whole, exactly once
    per registry entry, and the live one keeps everything."""
    blocks = 2 * PURGE_CHUNK_BLOCKS + 123
    # The live worker first: registered after the dead one's lease ended (its index takes a while to
    # write on a busy machine), it would take the dead one's slot, and purge its blocks itself.
    live = await _register_with_queue(registry, "live", ttl_s=60)
    await index.resync("live", live.slot, "m", CHAIN, 0)
    _fill_queue(redis_client, keys, live, messages=4)
    dead = await _register_with_queue(registry, "dead", ttl_s=0.3)
    await index.resync("dead", dead.slot, "m", list(range(1, blocks + 1)), 0)
    _fill_queue(redis_client, keys, dead, messages=11)
    await wait_lease_ended(registry, "dead")

    clients = [aioredis.from_url(redis_server.url) for _ in range(4)]
    try:
        reapers = [Reaper(Registry(c, keys), PrefixIndex(c, keys), grace_s=0) for c in clients]
        rounds = [await asyncio.gather(*(r.sweep() for r in reapers)) for _ in range(3)]
    finally:
        for c in clients:
            await c.aclose()
    reports = [r for sweeps in rounds for sweep in sweeps for r in sweep]
    assert {r.worker_id for r in reports} == {"dead"}
    assert sum(r.removed for r in reports) == 1
    assert sum(r.blocks_cleared for r in reports) == blocks
    assert sum(r.messages_dropped for r in reports) == 11
    assert _worker_keys(redis_client, keys, "dead") == [] and _queue_state(redis_client, keys, dead) == (0, False)
    assert not any(redis_client.exists(keys.kv_block("m", h)) for h in (1, blocks // 2, blocks))
    assert _queue_state(redis_client, keys, live) == (4, True)
    assert await index.owners() == {live.slot: "live"}
    assert await index.overlaps("m", CHAIN, [live.slot]) == {live.slot: len(CHAIN)}
    assert [w.record.worker_id for w in await registry.live_workers()] == ["live"]


async def test_a_namesake_in_another_namespace_is_never_touched(registry: Registry, index: PrefixIndex,
                                                                 redis_client: redis.Redis, aredis: aioredis.Redis,
                                                                 keys: Keys) -> None:
    """Two deployments on one Redis may name a worker alike (``worker-1``): reaping the dead one of this
    namespace leaves every key of the other's, its queue and binding included, as it was."""
    other = Keys(f"{keys.namespace}-other")
    other_registry, other_index = Registry(aredis, other), PrefixIndex(aredis, other)
    try:
        twin = await _register_with_queue(other_registry, "w", ttl_s=60)
        await other_index.resync("w", twin.slot, "m", CHAIN, 0)
        _fill_queue(redis_client, other, twin, messages=3)
        before = {k: redis_client.dump(k) for k in redis_client.scan_iter(match=f"{other.prefix}:*", count=1000)}
        assert any(k.startswith(other.broker_prefix.encode()) for k in before)

        dead = await _register_with_queue(registry, "w", ttl_s=0.3)
        await index.resync("w", dead.slot, "m", CHAIN, 0)
        _fill_queue(redis_client, keys, dead, messages=5)
        await wait_lease_ended(registry, "w")
        assert [r.messages_dropped for r in await Reaper(registry, index, grace_s=0).sweep()] == [5]
        assert _worker_keys(redis_client, keys, "w") == []

        after = {k: redis_client.dump(k) for k in redis_client.scan_iter(match=f"{other.prefix}:*", count=1000)}
        assert after == before
        assert _queue_state(redis_client, other, twin) == (3, True)
        assert await other_index.overlaps("m", CHAIN, [twin.slot]) == {twin.slot: len(CHAIN)}
    finally:
        for key in redis_client.scan_iter(match=f"{other.prefix}:*", count=1000):
            redis_client.delete(key)
