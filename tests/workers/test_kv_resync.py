"""The worker's KV relay repairing the prefix index against a real Redis, without vLLM: vLLM's KV event
publisher is played by the test (the frames it sends over ZMQ, some of them lost or garbled), read by
the vLLM engine's feed and translator (workers.engines.vllm.kv_events) into the relay
(workers.kv_relay) that writes the index. The test keeps vLLM's side of the story: what its cache
really holds.

After a loss the index must list no block vLLM dropped, and exactly what the worker can still vouch
for (``cached_hashes``); each repair is counted in ``sluice_kv_index_resyncs_total`` by reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec
import pytest
import redis
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from core.keys import Keys
from router.hashing import block_hashes, root_hash
from workers.engines.vllm.kv_events import KvEventFeed, KvEventTranslator
from workers.kv_relay import RESYNC_REASONS, KvRelay
from workers.metrics import WorkerMetrics

MODEL = "m"
B = 4
WORKER = "w1"
SLOT = 0


def tokens(salt: int, blocks: int) -> list[int]:
    return [1000 * salt + i for i in range(blocks * B)]


@dataclass
class Publisher:
    """vLLM's side: its cache (vLLM hash -> the Sluice hash of that block) and the messages it publishes."""

    cache: dict[int, int] = field(default_factory=dict)
    seq: int = 0

    def store(self, vllm_hashes: list[int], token_ids: list[int], parent: int | None = None) -> dict:
        seed = root_hash(MODEL) if parent is None else self.cache[parent]
        self.cache.update(zip(vllm_hashes, block_hashes(token_ids, B, seed), strict=True))
        return {"type": "BlockStored", "block_hashes": vllm_hashes, "parent_block_hash": parent,
                "token_ids": token_ids, "block_size": B, "medium": "GPU"}

    def remove(self, vllm_hashes: list[int]) -> dict:
        for h in vllm_hashes:
            del self.cache[h]
        return {"type": "BlockRemoved", "block_hashes": vllm_hashes, "medium": "GPU"}

    def batch(self, *events: dict) -> list[bytes]:
        frames = [b"kv", self.seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), list(events), 0])]
        self.seq += 1
        return frames

    def truth(self) -> set[int]:
        return set(self.cache.values())


@dataclass
class Worker:
    relay: KvRelay
    translator: KvEventTranslator
    feed: KvEventFeed
    metrics: WorkerMetrics
    index: redis.Redis
    keys: Keys

    def held(self) -> set[int]:
        """The blocks the index lists for the worker, checked against their bitmaps."""
        listed = {int(h, 16) for h in self.index.smembers(self.keys.kv_worker(WORKER))}
        for h in listed:
            assert self.index.getbit(self.keys.kv_block(MODEL, h), SLOT) == 1
        return listed

    def resyncs(self) -> dict[str, float]:
        return {r: self.metrics.registry.get_sample_value("sluice_kv_index_resyncs_total", {"reason": r})
                for r in RESYNC_REASONS}


@pytest.fixture
async def worker(redis_server: RedisServer, redis_client: redis.Redis, namespace: str) -> AsyncIterator[Worker]:
    client = aioredis.from_url(redis_server.url)
    metrics = WorkerMetrics()
    relay = KvRelay(client, Keys(namespace), WORKER, MODEL, metrics)
    translator = KvEventTranslator(MODEL, B)
    w = Worker(relay, translator, KvEventFeed(translator, relay.push), metrics, redis_client, Keys(namespace))
    await relay.start(SLOT, translator.cached_hashes)  # go-live: a resync, but no repair
    yield w
    await relay.close()
    await client.aclose()


def counts(**nonzero: int) -> dict[str, float]:
    return {r: float(nonzero.get(r, 0)) for r in RESYNC_REASONS}


async def test_lost_batches_leave_no_dropped_block_in_the_index(worker: Worker, caplog: pytest.LogCaptureFixture) -> None:
    vllm = Publisher()
    worker.feed.receive(vllm.batch(vllm.store([11, 12, 13], tokens(1, 3))))
    worker.feed.receive(vllm.batch(vllm.store([21, 22], tokens(2, 2)), vllm.store([14], tokens(3, 1), parent=13)))
    await worker.relay.drained()
    assert worker.held() == vllm.truth() and len(vllm.truth()) == 6
    assert worker.resyncs() == counts()

    dropped = {vllm.cache[h] for h in (13, 14, 22)}
    vllm.batch(vllm.remove([14, 13]), vllm.remove([22]))  # published, never received (past the high-water mark)
    with caplog.at_level(logging.WARNING):
        worker.feed.receive(vllm.batch(vllm.store([31, 32], tokens(4, 2)), vllm.store([15], tokens(5, 1), parent=12)))
        await worker.relay.drained()
    held = worker.held()
    assert held <= vllm.truth() and not held & dropped  # nothing vLLM dropped (it had been listed: 13, 14, 22)
    assert held == set(worker.translator.cached_hashes()) == {vllm.cache[31], vllm.cache[32]}
    assert worker.resyncs() == counts(gap=1)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("batch 2 was lost" in m for m in warned) and any("(gap)" in m for m in warned)

    # What comes after the repair is relayed as usual.
    worker.feed.receive(vllm.batch(vllm.store([33], tokens(6, 1), parent=32), vllm.remove([31])))
    await worker.relay.drained()
    assert worker.held() == {vllm.cache[32], vllm.cache[33]} <= vllm.truth()
    assert worker.resyncs() == counts(gap=1)


async def test_an_unreadable_batch_is_repaired_like_a_lost_one(worker: Worker) -> None:
    vllm = Publisher()
    worker.feed.receive(vllm.batch(vllm.store([11, 12], tokens(1, 2))))
    await worker.relay.drained()
    assert worker.held() == vllm.truth()

    frames = vllm.batch(vllm.remove([12]))
    worker.feed.receive([*frames[:2], b"\xc1" + frames[2][1:]])  # garbled on the way
    await worker.relay.drained()
    assert worker.held() == set() and worker.resyncs() == counts(undecodable=1)

    worker.feed.receive(vllm.batch(vllm.store([41], tokens(7, 1))))
    await worker.relay.drained()
    assert worker.held() == {vllm.cache[41]} <= vllm.truth()


async def test_the_relay_counts_its_own_repairs(worker: Worker) -> None:
    """The index refusing a batch (it lost the worker's record) and a re-registration each rebuild the
    index from the engine's cache, counted under their own reason."""
    vllm = Publisher()
    worker.feed.receive(vllm.batch(vllm.store([11, 12], tokens(1, 2))))
    await worker.relay.drained()
    worker.index.delete(worker.keys.kv_worker_meta(WORKER))  # as if the index had lost the worker
    worker.feed.receive(vllm.batch(vllm.store([21], tokens(2, 1))))
    await worker.relay.drained()
    assert worker.held() == vllm.truth() and worker.resyncs() == counts(refused=1)

    await worker.relay.start(SLOT, worker.translator.cached_hashes)  # the worker registered again
    assert worker.held() == vllm.truth() and worker.resyncs() == counts(refused=1, lease_lost=1)
    assert worker.metrics.kv_index_resyncs_total() == 2
