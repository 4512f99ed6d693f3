"""What ``sluice status``, the frontend's scrape and the discovery read from Redis (router.cluster,
router.frontends, router.queues), against the session's Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from core.keys import Keys
from router.cluster import ClusterReader
from router.frontends import FrontendRecord, FrontendRegistry
from router.queues import queue_depths, queue_list_keys
from router.registry import Registry, WorkerLoad, WorkerRecord
from tests.router.factories import RoundTripCounter


def record(keys: Keys, wid: str, pool: str = "agg", model: str = "m") -> WorkerRecord:
    return WorkerRecord(worker_id=wid, model=model, model_path="/m", pool=pool, queue=keys.worker_queue(wid),
                        pool_queue=keys.pool_queue(model, pool), engine="mocker", block_size=16, kv_blocks=100,
                        max_num_seqs=8, context_length=1024, started_at=time.time(),
                        metrics_url=f"http://127.0.0.1:9{len(wid)}/metrics")


def frontend(fid: str, in_flight: int = 0) -> FrontendRecord:
    return FrontendRecord(frontend_id=fid, url=f"http://h-{fid}:8000", metrics_url=f"http://h-{fid}:8000/metrics",
                          router_mode="kv", started_at=time.time(), in_flight=in_flight, updated_at=time.time())


@pytest.fixture
async def queues_cleanup(aredis: aioredis.Redis, keys: Keys) -> AsyncIterator[None]:
    """Celery queues are named outside the namespace's key prefix: delete them after the test."""
    yield
    names = [name async for name in aredis.scan_iter(match=f"sluice.{keys.namespace}.*")]
    if names:
        await aredis.delete(*names)


def test_a_queue_is_every_priority_list_kombu_keeps() -> None:
    assert queue_list_keys(Keys("ns"), "sluice.ns.m.agg") == Keys("ns").broker_queue_lists("sluice.ns.m.agg")
    assert queue_list_keys(Keys("ns"), "sluice.ns.m.agg")[0] == "sluice:ns:celery:sluice.ns.m.agg"


async def test_queue_depths_sum_the_priority_lists_in_one_round_trip(counter: RoundTripCounter, keys: Keys,
                                                                     queues_cleanup: None) -> None:
    client = counter.client
    pool, own, empty = keys.pool_queue("m", "agg"), keys.worker_queue("w1"), keys.worker_queue("w2")
    lists = queue_list_keys(keys, pool)
    await client.lpush(lists[0], b"a", b"b")
    await client.lpush(lists[-1], b"c")
    await client.lpush(queue_list_keys(keys, own)[1], b"d")
    sends, depths = await counter.count(lambda: queue_depths(client, keys, [pool, own, empty, pool]))
    assert depths == {pool: 3, own: 1, empty: 0}
    assert sends == 1
    assert await queue_depths(client, keys, []) == {}


async def test_frontends_are_listed_while_their_lease_lasts(aredis: aioredis.Redis, keys: Keys) -> None:
    frontends = FrontendRegistry(aredis, keys)
    await frontends.renew(frontend("f1", in_flight=3), ttl_s=30)
    await frontends.renew(frontend("f2"), ttl_s=0.2)
    await aredis.set(keys.frontend_lease("old"), b"1", px=30_000)  # a frontend of an older release
    await aredis.zadd(keys.frontends, {"old": time.time() + 30})
    live = {f.record.frontend_id: f for f in await frontends.live()}
    assert set(live) == {"f1", "f2"}
    assert live["f1"].record.in_flight == 3 and live["f1"].record.url == "http://h-f1:8000"
    assert live["f1"].lease_expires_at == pytest.approx(time.time() + 30, abs=2)
    assert await aredis.pttl(keys.frontend_lease("f1")) > 25_000  # the lease workers check
    await asyncio.sleep(0.4)
    assert [f.record.frontend_id for f in await frontends.live()] == ["f1"]
    await frontends.remove("f1")
    assert await frontends.live() == []
    assert not await aredis.exists(keys.frontend_lease("f1"))


async def test_a_snapshot_holds_workers_frontends_queues_and_index_sizes(counter: RoundTripCounter, keys: Keys,
                                                                         queues_cleanup: None) -> None:
    client = counter.client
    registry = Registry(client, keys)
    a = await registry.register(record(keys, "a"), WorkerLoad(running=2, active_blocks=5, total_blocks=100), 30)
    await registry.register(record(keys, "bb", pool="decode"), WorkerLoad(draining=True), 30)
    gone = await registry.register(record(keys, "gone"), WorkerLoad(), 30)
    await registry.deregister(gone.worker_id)
    await FrontendRegistry(client, keys).renew(frontend("f1"), 30)
    await client.lpush(queue_list_keys(keys, keys.pool_queue("m", "agg"))[0], b"x", b"y")
    await client.lpush(queue_list_keys(keys, keys.worker_queue("a"))[2], b"z")
    await client.sadd(keys.kv_worker("a"), "00ff", "0100")
    await client.zadd(keys.kv_worker_approx("bb"), {"0aaa": time.time() * 1000 + 60_000})

    reader = ClusterReader(client, keys)
    await reader.read()  # opens the connections the concurrent reads use (their handshakes are sends too)
    sends, snap = await counter.count(reader.read)
    assert sends == 6
    assert snap.namespace == keys.namespace
    assert [w.record.worker_id for w in snap.workers] == ["a", "bb"]
    assert snap.workers[0].record.slot == a.slot and snap.workers[1].load.draining
    assert [f.record.frontend_id for f in snap.frontends] == ["f1"]
    assert snap.queue_messages == {keys.pool_queue("m", "agg"): 2, keys.worker_queue("a"): 1,
                                   keys.pool_queue("m", "decode"): 0, keys.worker_queue("bb"): 0}
    assert snap.index_blocks == {"a": 2, "bb": 1}
    assert snap.pool_queues() == {("m", "agg"): keys.pool_queue("m", "agg"), ("m", "decode"): keys.pool_queue("m", "decode")}
    assert snap.models() == ["m"]


async def test_a_snapshot_can_count_more_queues_and_leave_the_index_out(counter: RoundTripCounter, keys: Keys,
                                                                        queues_cleanup: None) -> None:
    """What the planner reads each tick: the queues of pools without a live worker too, no index sizes."""
    client = counter.client
    await Registry(client, keys).register(record(keys, "a"), WorkerLoad(), 30)
    await client.sadd(keys.kv_worker("a"), "00ff")
    empty_pool = keys.pool_queue("m", "prefill")
    await client.lpush(queue_list_keys(keys, empty_pool)[0], b"x")
    reader = ClusterReader(client, keys)
    await reader.read()
    sends, snap = await counter.count(lambda: reader.read(extra_queues=[empty_pool], index=False))
    assert sends == 4  # the registry's two, the frontends' one (none lives), the queues': no index sizes
    assert snap.index_blocks == {}
    assert snap.queue_messages == {keys.pool_queue("m", "agg"): 0, keys.worker_queue("a"): 0, empty_pool: 1}
