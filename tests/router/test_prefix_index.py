"""The prefix index against a real Redis: event batches, gaps and resyncs, purges, slot reuse, round trips."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from core.keys import Keys
from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch, decode_kv_batch
from router import prefix_index
from router.prefix_index import PrefixIndex, owner_tag
from router.resp import pack_command, pack_mget
from tests.router.factories import RoundTripCounter

CHAIN = [101, 102, 103, 104, 105, 106]


def batch(eid: int, *events, worker: str = "w1") -> KvEventBatch:  # type: ignore[no-untyped-def]
    return KvEventBatch(worker, eid, list(events))


async def test_batches_apply_in_order(index: PrefixIndex, aredis: aioredis.Redis, keys: Keys) -> None:
    await index.resync("w1", 3, "m", [], 0)
    r = await index.apply(batch(1, BlockStored(CHAIN[:4])), slot=3, model="m")
    assert (r.status, r.last_event_id, r.blocks_stored, r.needs_resync) == ("ok", 1, 4, False)
    assert await index.overlaps("m", CHAIN, [3, 0]) == {3: 4, 0: 0}

    r = await index.apply(batch(2, BlockRemoved([CHAIN[1], 999]), BlockStored(CHAIN[4:], parent_hash=CHAIN[3])),
                          slot=3, model="m")
    assert (r.status, r.blocks_stored, r.blocks_removed) == ("ok", 2, 1)
    assert await index.overlaps("m", CHAIN, [3]) == {3: 1}  # block 1 is gone: the leading run stops there
    assert not await aredis.exists(keys.kv_block("m", CHAIN[1]))  # no bit left: the key is deleted
    assert await aredis.getbit(keys.kv_block("m", CHAIN[2]), 3) == 1

    r = await index.apply(batch(3, AllBlocksCleared()), slot=3, model="m")
    assert (r.status, r.blocks_removed) == ("ok", 5)
    assert await index.overlaps("m", CHAIN, [3]) == {3: 0}
    assert await aredis.keys(keys.kv_block_prefix("m") + "*") == []
    assert await aredis.scard(keys.kv_worker("w1")) == 0


async def test_batches_are_appended_to_the_stream(index: PrefixIndex, aredis: aioredis.Redis, keys: Keys) -> None:
    await index.resync("w1", 0, "m", [1, 2], 0)
    sent = batch(1, BlockStored([3], parent_hash=2))
    await index.apply(sent, slot=0, model="m")
    entries = await aredis.xrange(keys.kv_events)
    resync_batch, applied = (decode_kv_batch(fields[b"b"]) for _, fields in entries)
    assert resync_batch.events == [AllBlocksCleared(), BlockStored([1, 2])]
    assert applied == sent


async def test_two_workers_share_blocks(index: PrefixIndex) -> None:
    await index.resync("w1", 0, "m", CHAIN[:3], 0)
    await index.resync("w2", 9, "m", CHAIN[:5], 0)
    assert await index.overlaps("m", CHAIN, [0, 9, 4]) == {0: 3, 9: 5, 4: 0}
    await index.apply(batch(1, BlockRemoved([CHAIN[0]])), slot=0, model="m")
    assert await index.overlaps("m", CHAIN, [0, 9]) == {0: 0, 9: 5}


async def test_duplicates_are_ignored_and_gaps_refused(index: PrefixIndex) -> None:
    await index.resync("w1", 1, "m", [], 0)
    assert (await index.apply(batch(1, BlockStored([1])), slot=1, model="m")).status == "ok"
    dup = await index.apply(batch(1, BlockStored([2])), slot=1, model="m")
    assert (dup.status, dup.last_event_id, dup.needs_resync) == ("dup", 1, False)
    gap = await index.apply(batch(3, BlockStored([3])), slot=1, model="m")
    assert (gap.status, gap.last_event_id, gap.needs_resync) == ("gap", 1, True)
    assert await index.overlaps("m", [1, 2], [1]) == {1: 1}
    assert await index.overlaps("m", [3], [1]) == {1: 0}  # nothing of the refused batch was applied

    await index.resync("w1", 1, "m", [1, 3], 3)  # the engine's whole state, as of event 3
    assert (await index.apply(batch(4, BlockStored([5])), slot=1, model="m")).status == "ok"
    assert await index.overlaps("m", [3], [1]) == {1: 1}
    assert await index.overlaps("m", [5], [1]) == {1: 1}


async def test_unknown_worker_starts_at_event_one(index: PrefixIndex) -> None:
    assert (await index.apply(batch(1, BlockStored([1])), slot=0, model="m")).status == "ok"
    other = await index.apply(batch(7, BlockStored([1]), worker="w2"), slot=1, model="m")
    assert other.status == "gap"  # the index never saw w2: it must resync first


async def test_slot_change_needs_resync(index: PrefixIndex) -> None:
    await index.resync("w1", 1, "m", [1, 2], 0)
    assert (await index.apply(batch(1, BlockStored([3])), slot=4, model="m")).status == "gap"
    await index.resync("w1", 4, "m", [1, 2, 3], 1)
    assert await index.overlaps("m", [1, 2, 3], [1, 4]) == {1: 0, 4: 3}
    assert await index.owners() == {4: "w1"}


async def test_resync_replaces_the_whole_state(index: PrefixIndex, aredis: aioredis.Redis, keys: Keys) -> None:
    await index.resync("w1", 2, "m", [1, 2, 3], 0)
    assert await index.resync("w1", 2, "m", [1, 7], 5) == 2
    assert await index.overlaps("m", [1, 2], [2]) == {2: 1}
    assert await index.overlaps("m", [1, 7], [2]) == {2: 2}
    assert {int(h, 16) for h in await aredis.smembers(keys.kv_worker("w1"))} == {1, 7}
    assert (await index.apply(batch(6, BlockStored([8])), slot=2, model="m")).status == "ok"


async def test_large_states_resync_and_purge_in_steps(index: PrefixIndex, monkeypatch: pytest.MonkeyPatch,
                                                      aredis: aioredis.Redis, keys: Keys) -> None:
    monkeypatch.setattr(prefix_index, "RESYNC_CHUNK_BLOCKS", 7)
    monkeypatch.setattr(prefix_index, "PURGE_CHUNK_BLOCKS", 5)
    first = list(range(1, 31))
    assert await index.resync("w1", 0, "m", first, 0) == 30
    assert await index.overlaps("m", first, [0]) == {0: 30}
    second = list(range(100, 120))
    assert await index.resync("w1", 0, "m", second, 0) == 20  # 30 old blocks > one step: purged first
    assert await index.overlaps("m", first, [0]) == {0: 0}
    assert await index.overlaps("m", second, [0]) == {0: 20}
    assert await index.purge("w1") == 20
    assert await aredis.keys(keys.kv_block_prefix("m") + "*") == []


async def test_purge_forgets_the_worker(index: PrefixIndex, aredis: aioredis.Redis, keys: Keys) -> None:
    await index.resync("w1", 5, "m", CHAIN, 0)
    await index.resync("w2", 6, "m", CHAIN[:2], 0)
    assert await index.purge("w1") == len(CHAIN)
    assert await index.overlaps("m", CHAIN, [5, 6]) == {5: 0, 6: 2}
    assert await index.owners() == {6: "w2"}
    assert not await aredis.exists(keys.kv_worker_meta("w1"), keys.kv_worker("w1"))
    assert await index.purge("w1") == 0  # idempotent
    # Its next batch finds the index without it: a gap, so it resyncs.
    assert (await index.apply(batch(1, BlockStored([1])), slot=5, model="m")).needs_resync is False
    assert (await index.apply(batch(9, BlockStored([1])), slot=5, model="m")).status == "gap"


async def test_recycled_slot_has_no_stale_bits(index: PrefixIndex) -> None:
    """w1 died holding slot 3 and nobody purged it yet; w2 is given slot 3."""
    await index.resync("w1", 3, "m", CHAIN, 0)
    r = await index.apply(batch(1, BlockStored([500]), worker="w2"), slot=3, model="m")
    assert r.status == "busy" and r.needs_resync  # w2 may not write over w1's bits
    await index.resync("w2", 3, "m", [500, 501], 0)  # purges w1 first
    assert await index.overlaps("m", CHAIN, [3]) == {3: 0}
    assert await index.overlaps("m", [500, 501], [3]) == {3: 2}
    assert await index.owners() == {3: "w2"}
    read = await index.read("m", [CHAIN], [3])
    assert read.tags.tolist() == [owner_tag("w2")]


async def test_scoring_read_is_one_round_trip(counter: RoundTripCounter, keys: Keys) -> None:
    index = PrefixIndex(counter.client, keys)
    long_chain = list(range(1, 513))
    for slot in range(0, 256, 5):
        await index.resync(f"w{slot}", slot, "m", long_chain[: slot + 100], 0)
    await index.overlaps("m", long_chain, [0])  # loads the script
    for slots in ([0, 5, 10, 15], list(range(256))):
        sends, overlaps = await counter.count(lambda s=slots: index.overlaps("m", long_chain, s))
        assert sends == 1
        assert overlaps == {s: (s + 100 if s % 5 == 0 else 0) for s in slots}
    sends, read = await counter.count(lambda: index.read(
        "m", [long_chain, long_chain[:64]], list(range(256)), with_sums=True))
    assert sends == 1
    assert read.overlaps[0][5] == 105 and read.overlaps[1][5] == 64
    assert read.tags[5] == owner_tag("w5") and read.tags[6] == 0
    assert read.decode.tolist() == read.prefill.tolist() == [0] * 256


async def test_resync_after_redis_restart(redis_server: RedisServer, keys: Keys) -> None:
    client = aioredis.from_url(redis_server.url)
    try:
        index = PrefixIndex(client, keys)
        await index.resync("w1", 0, "m", [1, 2], 0)
        assert (await index.apply(batch(1, BlockStored([3])), slot=0, model="m")).status == "ok"
        redis_server.restart()  # every key and the script cache are gone
        for _ in range(3):  # the client reconnects on its own; tolerate the first broken connection
            try:
                result = await index.apply(batch(2, BlockStored([4])), slot=0, model="m")
                break
            except redis.exceptions.ConnectionError:
                continue
        assert result.status == "gap"
        await index.resync("w1", 0, "m", [1, 2, 3, 4], 2)
        assert await index.overlaps("m", [1, 2, 3, 4], [0]) == {0: 4}
    finally:
        await client.aclose()


@pytest.mark.parametrize("n", [1, 3, 512, 513])
def test_pack_mget_is_the_plain_command(keys: Keys, n: int) -> None:
    hashes = [(0x9E3779B97F4A7C15 * (i + 1)) % 2**64 for i in range(n)]
    expected = pack_command("MGET", *(keys.kv_block("m", h) for h in hashes))
    assert pack_mget(keys.kv_block_prefix("m").encode(), hashes) == expected
