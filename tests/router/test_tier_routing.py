"""KV tiers in the prefix index and in the routing decision (docs/routing.md, "KV tiers"), against a real Redis:
tier events land under their own keys, resyncs and purges take them along (the shared tier's keys are the
model's, not a worker's), and the deciding script credits a tier's blocks by the worker's published credit."""

from __future__ import annotations

import dataclasses

import redis.asyncio as aioredis

from core.keys import Keys
from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from router.kv_policy import KvPolicy
from router.prefix_index import PrefixIndex
from router.registry import LiveWorker, parse_tier_credit
from tests.router.factories import make_worker
from tests.router.test_kv_policy import PROMPT, chain, req
from tests.router.test_kv_policy import policy as device_policy


def _bit(raw: bytes | None, slot: int) -> bool:
    return raw is not None and len(raw) > slot // 8 and bool(raw[slot // 8] & (0x80 >> (slot % 8)))


async def _held(client: aioredis.Redis, keys: Keys, letter: str, hashes: list[int], slot: int) -> list[bool]:
    prefix = keys.kv_block_prefix("m")
    return [_bit(await client.get(f"{prefix}{letter}{h:016x}"), slot) for h in hashes]


def policy(client: aioredis.Redis, keys: Keys, **settings: float) -> KvPolicy:
    """Full credit unless a test says otherwise (the deployment's default takes half)."""
    return device_policy(client, keys, **{"tier_credit_scale": 1.0, **settings})


def tiered(worker: LiveWorker, credit: str) -> LiveWorker:
    return dataclasses.replace(worker, load=dataclasses.replace(worker.load, tier_credit=credit))


def test_a_credit_string_parses_to_the_known_tiers_clamped() -> None:
    assert parse_tier_credit("host=0.7,disk=0.2,shared=1.5") == {"host": 0.7, "disk": 0.2, "shared": 1.0}
    assert parse_tier_credit("") == {}
    assert parse_tier_credit("host=x,gpu=0.5,disk=-1,shared=nan") == {"disk": 0.0}


async def test_tier_events_set_their_own_bits_and_a_cache_clear_keeps_them(
        aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    hs = chain(PROMPT)
    batches = [[BlockStored(hs[:6]), BlockStored(hs[:8], tier="host"), BlockStored(hs[:3], tier="disk")],
               [BlockRemoved(hs[6:8], tier="host"), AllBlocksCleared()]]
    for eid, events in enumerate(batches, start=1):
        assert (await index.apply(KvEventBatch("w0", eid, events), slot=3, model="m")).status == "ok"
    assert await _held(aredis, keys, "", hs[:6], 3) == [False] * 6  # the device cache was cleared
    assert await _held(aredis, keys, "h", hs[:8], 3) == [True] * 6 + [False] * 2
    assert await _held(aredis, keys, "d", hs[:4], 3) == [True] * 3 + [False]
    assert (await index.overlaps("m", hs, [3])) == {3: 0}  # the Python read counts device blocks only


async def test_resync_writes_the_tiers_and_purge_takes_them_but_not_the_shared_tier(
        aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    hs = chain(PROMPT)
    await index.resync("w0", 2, "m", hs[:2], 0, tiers={"host": hs[:5], "disk": hs[:9]})
    assert await _held(aredis, keys, "h", hs[:6], 2) == [True] * 5 + [False]
    assert await _held(aredis, keys, "d", hs[:10], 2) == [True] * 9 + [False]
    assert (await index.apply(KvEventBatch("w0", 1, [BlockStored(hs[:4], tier="shared")]), slot=2,
                              model="m")).status == "ok"
    shared = [f"{keys.kv_block_prefix('m')}g{h:016x}" for h in hs[:4]]
    assert await aredis.exists(*shared) == 4
    assert 0 < await aredis.pttl(shared[0]) <= index.shared_ttl_ms
    await index.resync("w0", 2, "m", hs[:1], 1, tiers={"host": hs[:1]})  # replaces the old state, tiers too
    assert await _held(aredis, keys, "h", hs[:2], 2) == [True, False]
    assert await _held(aredis, keys, "d", hs[:1], 2) == [False]
    await index.purge("w0", "m")
    assert await _held(aredis, keys, "h", hs[:1], 2) == [False]
    assert await aredis.exists(*shared) == 4  # the model's shared tier outlives any one worker
    await index.apply(KvEventBatch("w1", 1, [BlockRemoved(hs[:2], tier="shared")]), slot=4, model="m")
    assert await aredis.exists(*shared) == 2


async def test_a_worker_whose_host_tier_holds_the_prompt_wins_over_one_with_nothing(
        aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    hs = chain(PROMPT)  # 10 blocks
    await index.resync("w0", 0, "m", [], 0, tiers={"host": hs[:8]})
    await index.resync("w1", 1, "m", [], 0)
    workers = [tiered(make_worker("w0", 0, active_blocks=3), "host=0.75"), make_worker("w1", 1, active_blocks=2)]
    d = await policy(aredis, keys).best(req("r1"), workers)
    assert (d.worker_id, d.overlap_blocks, d.cost) == ("w0", 0, 7.0)  # 10 - 0.75 x 8 + 3; w1: 10 + 2
    plain = [make_worker("w0", 0, active_blocks=3), make_worker("w1", 1, active_blocks=2)]
    d = await policy(aredis, keys).best(req("r1"), plain)
    assert (d.worker_id, d.cost) == ("w1", 12.0)  # no credit published: the tier counts for nothing
    d = await policy(aredis, keys, tier_credit_scale=0.0).best(req("r1"), workers)
    assert (d.worker_id, d.cost) == ("w1", 12.0)  # the router set to weigh device blocks alone
    d = await policy(aredis, keys, tier_credit_scale=0.5).best(req("r1"), workers)
    assert (d.worker_id, d.cost) == ("w0", 10.0)  # half the credit: 10 - 0.375 x 8 + 3


async def test_the_device_holder_beats_the_host_tier_holder_at_equal_load(
        aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    hs = chain(PROMPT)
    await index.resync("w0", 0, "m", [], 0, tiers={"host": hs[:8], "disk": hs[:10]})
    await index.resync("w1", 1, "m", hs[:8], 0)
    workers = [tiered(make_worker("w0", 0), "host=0.75,disk=0.5"), tiered(make_worker("w1", 1), "host=0.75")]
    d = await policy(aredis, keys).best(req("r1"), workers)
    assert (d.worker_id, d.overlap_blocks, d.cost) == ("w1", 8, 2.0)  # w0: 10 - (0.75 x 8 + 0.5 x 2) = 3


async def test_the_shared_tier_credits_every_worker_by_its_own_credit(
        aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    hs = chain(PROMPT)
    await index.resync("w0", 0, "m", [], 0)
    await index.resync("w1", 1, "m", hs[:2], 0)
    await index.apply(KvEventBatch("w2", 1, [BlockStored(hs[:10], tier="shared")]), slot=2, model="m")
    workers = [tiered(make_worker("w0", 0), "shared=0.5"), tiered(make_worker("w1", 1), "shared=0.25")]
    d = await policy(aredis, keys).best(req("r1"), workers)
    assert (d.worker_id, d.cost) == ("w0", 5.0)  # w0: 10 - 0.5 x 10; w1: 10 - (2 + 0.25 x 8) = 6


async def test_a_recorded_prediction_counts_the_credited_blocks_as_not_to_compute(
        aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    hs = chain(PROMPT)
    await index.resync("w0", 0, "m", [], 0, tiers={"host": hs[:8]})
    workers = [tiered(make_worker("w0", 0), "host=1.0")]
    p = policy(aredis, keys)
    assert (await p.choose(req("r1"), workers)).worker_id == "w0"
    record = await aredis.hget(keys.router_inflight_requests("m"), "r1")
    assert record is not None and record.split()[:3] == [b"0", b"10", b"2"]  # 10 decode blocks, 2 to prefill
