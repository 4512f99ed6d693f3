"""Purging dead workers: lease expiry, clean deregistration, and slot reuse without stale bits."""

from __future__ import annotations

import time

from router.prefix_index import PrefixIndex, owner_tag
from router.reaper import reap_dead_workers
from router.registry import Registry, WorkerLoad
from tests.router.factories import make_record, wait_for

CHAIN = [11, 12, 13, 14]


async def _register(registry: Registry, worker_id: str, ttl_s: float):  # type: ignore[no-untyped-def]
    return await registry.register(make_record(worker_id, -1), WorkerLoad(updated_at=time.time()), ttl_s)


async def test_expired_worker_is_purged_and_its_slot_comes_back_clean(registry: Registry, index: PrefixIndex) -> None:
    dead = await _register(registry, "dead", ttl_s=0.3)
    alive = await _register(registry, "alive", ttl_s=60)
    await index.resync("dead", dead.slot, "m", CHAIN, 0)
    await index.resync("alive", alive.slot, "m", CHAIN[:2], 0)

    await wait_for(registry.expired_workers)  # the lease runs out: no heartbeat came
    assert await reap_dead_workers(registry, index) == ["dead"]
    assert await index.overlaps("m", CHAIN, [dead.slot, alive.slot]) == {dead.slot: 0, alive.slot: 2}
    assert await index.owners() == {alive.slot: "alive"}
    assert await registry.expired_workers() == []

    fresh = await _register(registry, "fresh", ttl_s=60)
    assert fresh.slot == dead.slot  # the slot is recycled...
    read = await index.read("m", [CHAIN], [fresh.slot])
    assert read.overlaps[0].tolist() == [0] and read.tags.tolist() == [0]  # ...without the dead worker's bits
    assert await reap_dead_workers(registry, index) == []


async def test_slot_taken_before_the_reaper_ran(registry: Registry, index: PrefixIndex) -> None:
    dead = await _register(registry, "dead", ttl_s=0.3)
    await index.resync("dead", dead.slot, "m", CHAIN, 0)
    await wait_for(registry.expired_workers)
    taker = await _register(registry, "taker", ttl_s=60)  # the registry hands out a slot whose lease ended
    assert taker.slot == dead.slot
    read = await index.read("m", [CHAIN], [taker.slot])
    assert read.tags.tolist() == [owner_tag("dead")]  # routers see the bits are not the taker's: ignored
    await index.resync("taker", taker.slot, "m", [99], 0)  # purges the dead owner first
    assert await index.overlaps("m", CHAIN, [taker.slot]) == {taker.slot: 0}
    assert await index.overlaps("m", [99], [taker.slot]) == {taker.slot: 1}
    assert await reap_dead_workers(registry, index) == ["dead"]  # the registry entry still goes
    assert await index.overlaps("m", [99], [taker.slot]) == {taker.slot: 1}


async def test_deregistered_worker_is_purged(registry: Registry, index: PrefixIndex) -> None:
    w = await _register(registry, "w", ttl_s=60)
    await index.resync("w", w.slot, "m", CHAIN, 0)
    await registry.deregister("w")  # a clean shutdown that forgot the index
    assert await reap_dead_workers(registry, index) == ["w"]
    assert await index.overlaps("m", CHAIN, [w.slot]) == {w.slot: 0}


async def test_live_workers_are_left_alone(registry: Registry, index: PrefixIndex) -> None:
    w = await _register(registry, "w", ttl_s=60)
    await index.resync("w", w.slot, "m", CHAIN, 0)
    assert await reap_dead_workers(registry, index) == []
    assert await index.overlaps("m", CHAIN, [w.slot]) == {w.slot: 4}
