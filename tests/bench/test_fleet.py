"""The fleet simulator (bench.fleet.sim) at a small scale against a private Redis: every simulated worker
registers under a lease that its heartbeats keep, the index holds exactly each engine's cache, a real
routing decision finds the worker that holds a prompt's history, and stopping leaves nothing behind."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from bench.fleet.sim import MODEL, Fleet, FleetSpec, worker_id
from bench.fleet.workload import FleetWorkload, fresh_tokens, worker_prompt
from core.keys import Keys
from core.redis_topology import plain_client
from core.settings import RouterSettings
from router.hashing import block_hashes, root_hash
from router.kv_policy import KvPolicy
from router.policies import RouteRequest
from router.registry import Registry

WORKLOAD = FleetWorkload(groups=4, prefix_tokens=512, suffix_tokens=(256, 768), requests_per_worker=4)
#: Far above what a phase takes on a busy 2-core machine (a few seconds).
PHASE_TIMEOUT_S = 120
#: Ten heartbeats per lease: a lease survives a stall of the (busy) machine of almost two seconds.
SPEC = FleetSpec(workers=20, first=100, kv_blocks=128, heartbeat_s=0.2, lease_ttl_s=2.0, workload=WORKLOAD)


@pytest.fixture
async def client(bench_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = plain_client(bench_redis.url, "background")  # as a worker's: cancellations are never lost
    yield client
    await client.aclose()


async def test_a_fleet_registers_heartbeats_fills_the_index_and_is_routed_to(client: aioredis.Redis) -> None:
    keys = Keys(f"fleet{random.randrange(1 << 30)}")
    fleet = Fleet(client, keys, SPEC)
    registry = Registry(client, keys)
    # Each phase is bounded inside the test: a phase that never ends fails here, and the fleet is still
    # stopped (pytest-timeout's own interrupt would leave its tasks to the event loop's close).
    async with asyncio.timeout(PHASE_TIMEOUT_S):
        started = await fleet.start()
    try:
        assert started.workers == 20
        live = await registry.live_workers(MODEL)
        ids = [worker_id(i) for i in range(100, 120)]
        assert sorted(w.record.worker_id for w in live) == ids
        assert len({w.record.slot for w in live}) == 20
        assert {w.record.queue for w in live} == {keys.worker_queue(i) for i in ids}

        try:
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                ingest = await fleet.drive()
        except TimeoutError:
            pytest.fail(f"the fleet's requests and KV relays did not finish in {PHASE_TIMEOUT_S} s")
        assert ingest.requests == 80 and ingest.batches > 0
        assert ingest.blocks_removed > 0, "the caches never evicted: the workload is too small for the test"
        assert ingest.cached_tokens > 0, "no request reused its group's prefix"

        # Leases outlive two lease periods through the heartbeats alone.
        await asyncio.sleep(2 * SPEC.lease_ttl_s)
        assert len(await registry.live_workers(MODEL)) == 20
        leases = fleet.lease_stats()
        assert leases.heartbeats >= 20 * 5 and (leases.failures, leases.reregistrations) == (0, 0)

        # The index lists exactly what every engine caches (bitmaps at the worker's slot included).
        sizes = await fleet.workers[0].relay.index.sizes(ids)
        for w in fleet.workers:
            cached = w.engine.cached_block_hashes()
            assert sizes[w.record.worker_id] == len(cached) > 0
            held = await client.smembers(keys.kv_worker(w.record.worker_id))
            assert held == {f"{h:016x}".encode() for h in cached}
            some = cached[len(cached) // 2]
            assert await client.getbit(keys.kv_block(MODEL, some), w.record.slot) == 1

        # A routing decision over the fleet: the last request of worker 107 continued by a new turn
        # goes to 107, which holds that history (its group's other workers hold only the prefix).
        history = worker_prompt(WORKLOAD, 107, WORKLOAD.requests_per_worker - 1)
        prompt = history + fresh_tokens(5, 300)
        chain = block_hashes(history, SPEC.block_size, root_hash(MODEL))
        holder = next(w for w in fleet.workers if w.index == 107)
        assert set(chain) <= set(holder.engine.cached_block_hashes())
        policy = KvPolicy(client, keys, RouterSettings(), rng=random.Random(0))
        try:
            decision = await policy.choose(RouteRequest("fleet-route-1", MODEL, prompt), live)
            assert (decision.worker_id, decision.overlap_blocks) == (worker_id(107), len(chain))
            best = await policy.best(RouteRequest("fleet-route-2", MODEL, prompt), live)
            assert (best.worker_id, best.overlap_blocks) == (worker_id(107), len(chain))
            policy.release("fleet-route-1")
        finally:
            await policy.aclose()
    finally:
        await fleet.stop()
        await registry.aclose()
    assert await registry.live_workers(MODEL) == []
    assert [k async for k in client.scan_iter(match=f"{keys.kv_block_prefix(MODEL)}*")] == []
