"""The routing state on a real three-node Redis Cluster (started here), the broker on the session's
plain Redis: every script the routing state runs (a CROSSSLOT or non-local key error fails the test),
a worker's index writes, a decision without its enqueue, the release, the reaper, and models on shards."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from bench.devstack import RedisServer
from core.keys import Keys
from core.messages import BlockRemoved, BlockStored, KvEventBatch
from core.redis_connection import BoundedSend
from core.redis_topology import cluster_client
from core.settings import RouterSettings
from router.hashing import block_hashes, root_hash
from router.kv_policy import KvPolicy
from router.policies import RouteRequest
from router.prefix_index import PrefixIndex
from router.reaper import SplitReaper, make_reaper
from router.registry import LiveWorker, Registry, WorkerLoad
from tests.integration.test_redis_cancellation import lost_cancellations
from tests.router.factories import make_record
from tests.support.redis_topologies import RedisClusterNodes

PROMPT = list(range(2000, 2040))  # 10 blocks of 4 tokens


def chain(model: str, tokens: list[int] = PROMPT) -> list[int]:
    return block_hashes(tokens, 4, root_hash(model))


@pytest.fixture(scope="module")
def cluster_nodes() -> Iterator[RedisClusterNodes]:
    with RedisClusterNodes().start() as nodes:
        yield nodes


@pytest.fixture
async def cluster(cluster_nodes: RedisClusterNodes) -> AsyncIterator[RedisCluster]:
    client = cluster_client(cluster_nodes.url, "background")
    await client.initialize()
    yield client
    await client.aclose()


@pytest.fixture
async def broker(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace, hash_tags=True)


async def _register(registry: Registry, worker_id: str, model: str, *, kv_events: bool = True) -> LiveWorker:
    record = make_record(worker_id, -1, model=model)
    if not kv_events:
        from dataclasses import replace
        record = replace(record, kv_events=False)
    record = await registry.register(record, WorkerLoad(total_blocks=1000), ttl_s=30)
    return LiveWorker(record, WorkerLoad(total_blocks=1000), 0.0)


async def test_decide_release_and_index_writes_on_the_cluster(cluster: RedisCluster, keys: Keys) -> None:
    registry = Registry(cluster, keys)
    index = PrefixIndex(cluster, keys)
    w0, w1 = await _register(registry, "w0", "m"), await _register(registry, "w1", "m")
    guess = await _register(registry, "w2", "m", kv_events=False)  # approximate mode: DECIDE writes guesses
    assert sorted(w.record.worker_id for w in await registry.live_workers("m")) == ["w0", "w1", "w2"]
    assert await registry.heartbeat(w0.record, WorkerLoad(total_blocks=1000), 30) is None

    # The worker side: a resync, then an event batch (APPLY), on the model's shard.
    await index.resync("w0", w0.record.slot, "m", chain("m")[:6], 0)
    batch = KvEventBatch("w0", 1, [BlockStored(chain("m")[6:8]), BlockRemoved([chain("m")[7]])])
    assert (await index.apply(batch, slot=w0.record.slot, model="m")).status == "ok"
    assert await index.overlaps("m", chain("m"), [w0.record.slot, w1.record.slot]) == \
        {w0.record.slot: 7, w1.record.slot: 0}

    policy = KvPolicy(cluster, keys, RouterSettings(overlap_score_weight=1.0), rng=random.Random(0), enqueues=False)
    workers = [w0, w1, guess]
    assert (await policy.best(RouteRequest("probe", "m", PROMPT), workers)).worker_id == "w0"
    decision = await policy.choose(RouteRequest("r1", "m", PROMPT), workers)
    assert (decision.worker_id, decision.overlap_blocks, decision.enqueued) == ("w0", 7, False)
    assert await cluster.hlen(keys.router_inflight_requests("m")) == 1
    # Pinned to the approximate worker: its guesses are recorded in the same script.
    from router.policies import RouterOverrides
    pinned = await policy.choose(RouteRequest("r2", "m", PROMPT, overrides=RouterOverrides(worker_id="w2")), workers)
    assert pinned.worker_id == "w2"
    assert await cluster.zcard(keys.kv_worker_approx("w2", "m")) == 10
    policy.release("r1")
    policy.release("r2")
    await policy.flush()
    assert await cluster.hlen(keys.router_inflight_requests("m")) == 0
    assert await cluster.get(keys.router_inflight("m")) == bytes(8 * 3)
    assert await index.sizes(["w0", "w2"], "m") == {"w0": 7, "w2": 10}
    assert await index.expire_guesses(["w2"], "m") == 0
    assert await index.purge("w0", "m") == 7
    await policy.aclose()


async def test_the_reaper_forgets_a_gone_worker_across_the_two_planes(
        cluster: RedisCluster, broker: aioredis.Redis, keys: Keys) -> None:
    registry = Registry(cluster, keys)
    index = PrefixIndex(cluster, keys)
    gone = await _register(registry, "gone", "m2")
    stays = await _register(registry, "stays", "m2")
    await index.resync("gone", gone.record.slot, "m2", chain("m2")[:5], 0)
    await index.resync("stays", stays.record.slot, "m2", chain("m2")[:3], 0)
    await broker.lpush(keys.broker_queue_list(gone.record.queue), b"task")
    await registry.deregister("gone")
    reaper = make_reaper(registry, index, broker, grace_s=0.0)
    assert isinstance(reaper, SplitReaper)
    done = {r.worker_id: r for r in await reaper.sweep()}
    assert (done["gone"].blocks_cleared, done["gone"].messages_dropped, done["gone"].removed) == (5, 1, True)
    assert "stays" not in done
    assert await broker.exists(keys.broker_queue_list(gone.record.queue)) == 0
    assert set((await index.owners("m2")).values()) == {"stays"}
    assert [w.record.worker_id for w in await registry.live_workers("m2")] == ["stays"]
    assert await registry.worker_queue("gone") is None
    await broker.delete(keys.broker_queue_list(stays.record.queue))


async def test_models_spread_over_the_shards(cluster: RedisCluster, keys: Keys) -> None:
    models = [f"model-{i}" for i in range(8)]
    shards = {model: cluster.get_node_from_key(keys.kv_block_prefix(model)).name for model in models}
    assert len(set(shards.values())) >= 2, shards
    # Each model's routing state sits on its model's shard: a decision per model works wherever it lands.
    registry = Registry(cluster, keys)
    index = PrefixIndex(cluster, keys)
    policy = KvPolicy(cluster, keys, RouterSettings(), rng=random.Random(0), enqueues=False)
    for n, model in enumerate(models[:4]):
        worker = await _register(registry, f"mw{n}", model)
        await index.resync(f"mw{n}", worker.record.slot, model, chain(model)[:4], 0)
        decision = await policy.choose(RouteRequest(f"q{n}", model, PROMPT), [worker])
        assert (decision.worker_id, decision.overlap_blocks) == (f"mw{n}", 4)
        policy.release(f"q{n}")
        node = cluster.get_node_from_key(keys.router_inflight(model))
        assert node.name == shards[model]
        await index.purge(f"mw{n}", model)
    await policy.aclose()


async def test_the_cluster_client_delivers_every_cancel(cluster: RedisCluster) -> None:
    """Its nodes' connections write commands without losing a cancellation (core.redis_connection)."""
    assert all(issubclass(node.connection_class, BoundedSend) for node in cluster.get_nodes())
    assert await lost_cancellations(cluster, lambda c: c.get("{cancel}-test"), rounds=1) == []  # type: ignore[arg-type]
    assert await cluster.set("{cancel}-test", 1)
