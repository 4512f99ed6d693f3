"""The KV-aware policy against a real Redis: costs, herding, several frontends, approximate mode."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter

import numpy as np
import pytest
import redis.asyncio as aioredis

from bench.devstack import RedisServer
from core.errors import NoWorkerAvailable
from core.keys import ROUTER_TABLE_TTL_MS, Keys
from core.settings import RouterSettings
from core.timing import TimingModel
from router.hashing import block_hashes, root_hash
from router.kv_policy import KvPolicy
from router.policies import RouteRequest, RouterOverrides, TaskParts
from router.prefix_index import PrefixIndex
from router.registry import LiveWorker
from tests.router.cost_oracle import oracle_best
from tests.router.factories import RoundTripCounter, make_worker, wait_for

PROMPT = list(range(1000, 1040))  # 10 blocks of 4 tokens
ROOT = root_hash("m")


def chain(tokens: list[int], block_size: int = 4, lora: str | None = None) -> list[int]:
    return block_hashes(tokens, block_size, root_hash("m", lora))


def req(rid: str, tokens: list[int] = PROMPT, **overrides) -> RouteRequest:  # type: ignore[no-untyped-def]
    return RouteRequest(rid, "m", tokens, overrides=RouterOverrides(**overrides))


def policy(client: aioredis.Redis, keys: Keys, seed: int = 0, **settings) -> KvPolicy:  # type: ignore[no-untyped-def]
    """The arithmetic in these tests is the block cost at overlap_score_weight 1 unless a test says otherwise."""
    return KvPolicy(client, keys, RouterSettings(**{"overlap_score_weight": 1.0, "cost": "blocks", **settings}),
                    rng=random.Random(seed))


async def test_prefers_the_cached_prefix(aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    await index.resync("w0", 0, "m", chain(PROMPT)[:8], 0)
    workers = [make_worker("w0", 0), make_worker("w1", 1)]
    d = await policy(aredis, keys).choose(req("r1"), workers)
    assert (d.worker_id, d.queue, d.overlap_blocks, d.cost) == ("w0", "q.w0", 8, 2.0)  # 1 × (10 − 8) + 0


async def test_a_busy_cached_worker_loses_to_an_idle_one(aredis: aioredis.Redis, keys: Keys,
                                                         index: PrefixIndex) -> None:
    await index.resync("w0", 0, "m", chain(PROMPT)[:8], 0)
    workers = [make_worker("w0", 0, active_blocks=20), make_worker("w1", 1, active_blocks=3)]
    d = await policy(aredis, keys).best(req("r1"), workers)
    assert (d.worker_id, d.overlap_blocks, d.cost) == ("w1", 0, 13.0)  # w0 would cost 2 + 20
    d = await policy(aredis, keys).best(req("r1", overlap_score_weight=4.0), workers)
    assert (d.worker_id, d.cost) == ("w0", 28.0)  # 4 × 2 + 20 beats 4 × 10 + 3


async def test_inflight_predictions_queued_prefill_and_release(aredis: aioredis.Redis, keys: Keys,
                                                               index: PrefixIndex) -> None:
    await index.resync("w0", 0, "m", chain(PROMPT)[:8], 0)
    workers = [make_worker("w0", 0), make_worker("w1", 1)]
    p = policy(aredis, keys)
    assert (await p.choose(req("r1"), workers)).worker_id == "w0"  # predicts 10 decode, 2 prefill on w0
    d = await p.best(req("r2"), workers)
    assert (d.worker_id, d.cost) == ("w1", 10.0)  # w0: 1 × (2 + 2 queued) + 10 = 14
    other = policy(aredis, keys)  # another frontend sees the same prediction
    assert (await other.best(req("r2"), workers)).cost == 10.0
    p.prefill_done("r1")
    await p.flush()
    assert await aredis.bitfield(keys.router_inflight("m")).get("u32", "#0").get("u32", "#1").execute() == [10, 0]
    p.release("r1")
    await p.flush()
    assert await aredis.get(keys.router_inflight("m")) == bytes(8)  # slot 0: two zero uint32
    assert await aredis.hlen(keys.router_inflight_requests("m")) == 0
    d = await p.best(req("r2"), workers)
    assert (d.worker_id, d.cost) == ("w0", 2.0)
    p.release("unknown")  # no-op


async def test_heartbeat_load_and_predictions_are_not_double_counted(aredis: aioredis.Redis, keys: Keys) -> None:
    p = policy(aredis, keys)
    await p.choose(req("r1"), [make_worker("w0", 0)])  # 10 predicted blocks on w0, 10 queued prefill
    assert (await p.best(req("r2"), [make_worker("w0", 0)])).cost == (10 + 10) + 10
    p.prefill_done("r1")
    await p.flush()
    # The engine now reports the request as active: 10 blocks, not 20.
    assert (await p.best(req("r2"), [make_worker("w0", 0, active_blocks=10)])).cost == 10 + 10
    assert (await p.best(req("r2"), [make_worker("w0", 0, active_blocks=25)])).cost == 10 + 25


@pytest.mark.parametrize(("weight", "w0_picks", "other_picks"), [(1.0, (14, 17), 7), (None, (27, 29), 3)])
async def test_shared_system_prompt_does_not_herd(aredis: aioredis.Redis, keys: Keys, index: PrefixIndex,
                                                  weight: float | None, w0_picks: tuple[int, int],
                                                  other_picks: int) -> None:
    """One worker cached a 32-block system prompt; every request shares it. The load term must spread them."""
    system = list(range(128))
    await index.resync("w0", 0, "m", chain(system), 0)
    workers = [make_worker(f"w{i}", i) for i in range(4)]
    p = policy(aredis, keys, overlap_score_weight=weight if weight is not None else RouterSettings().overlap_score_weight)
    picks = Counter()
    for i in range(40):
        d = await p.choose(req(f"r{i}", system + [50_000 + i] * 16), workers)
        picks[d.worker_id] += 1
    assert set(picks) == {"w0", "w1", "w2", "w3"}
    # Weight W: w0 costs W(4 + 4k) + 36k after k requests (4 uncached blocks, its queued prefill, 36
    # decode blocks each), the others W(36 + 36m) + 36m. W = 1: about 16 requests for w0 and 8 for each
    # other worker; W = 16 (the default): about 28 for w0 and 4 for each other.
    assert w0_picks[0] <= picks["w0"] <= w0_picks[1] and min(picks.values()) >= other_picks


async def test_two_frontends_do_not_pile_on(redis_server: RedisServer, aredis: aioredis.Redis, keys: Keys) -> None:
    second = aioredis.from_url(redis_server.url)
    try:
        frontends = [policy(aredis, keys, seed=1), policy(second, keys, seed=2)]
        workers = [make_worker(f"w{i}", i) for i in range(4)]
        decisions = await asyncio.gather(*(
            frontends[i % 2].choose(req(f"r{i}"), workers) for i in range(40)))
        # Every decision saw all the ones recorded before it: exactly even, as if one router made them all.
        assert Counter(d.worker_id for d in decisions) == {f"w{i}": 10 for i in range(4)}
    finally:
        await second.aclose()


async def test_round_trips(counter: RoundTripCounter, keys: Keys, index: PrefixIndex) -> None:
    workers = [make_worker(f"w{i}", i) for i in range(64)]
    long_prompt = list(range(2048))
    await index.resync("w7", 7, "m", chain(long_prompt), 0)
    p = policy(counter.client, keys)
    await p.choose(req("warm"), workers)  # loads the scripts
    sends, d = await counter.count(lambda: p.best(req("a", long_prompt), workers))
    assert (sends, d.worker_id, d.overlap_blocks) == (1, "w7", 512)
    sends, d = await counter.count(lambda: p.choose(req("b", long_prompt), workers))
    assert (sends, d.worker_id, d.overlap_blocks) == (1, "w7", 512)  # read, score and record in one call
    await p.choose(req("c", long_prompt), workers)
    p.release("warm")
    p.prefill_done("b")
    p.release("b")
    p.prefill_done("c")
    sends, _ = await counter.count(p.flush)
    assert sends == 1  # everything pending goes in one call
    sums = np.frombuffer(await counter.client.get(keys.router_inflight("m")), dtype=">u4").reshape(-1, 2)
    assert sums.sum(axis=0).tolist() == [512, 0]  # c's decode blocks; its prefill is done, b is gone
    p.release("c")
    sends, _ = await counter.count(lambda: p.choose(req("d"), workers))
    assert sends == 1  # the pending release rode along with the next decision: no call of its own
    sums = np.frombuffer(await counter.client.get(keys.router_inflight("m")), dtype=">u4").reshape(-1, 2)
    assert sums.sum(axis=0).tolist() == [10, 10]  # only d: c was released first, in the same call


async def test_the_candidate_table_is_sent_once_then_named(counter: RoundTripCounter, keys: Keys,
                                                           index: PrefixIndex) -> None:
    """The first decision over a candidate list sends its columns, which Redis keeps; the decisions after
    it send the table's id. A decision that finds the table gone sends it again (its one second round
    trip), and the table of a new registry snapshot replaces the old one."""
    await index.resync("w1", 1, "m", chain(PROMPT), 0)
    workers = [make_worker(f"w{i}", i) for i in range(64)]
    p = policy(counter.client, keys)
    await p.choose(req("warm"), workers)  # loads the script
    stored = await counter.client.keys(keys.router_table("m", "*"))
    assert len(stored) == 1 and 0 < await counter.client.pttl(stored[0]) <= ROUTER_TABLE_TTL_MS
    p.release("warm")
    before = counter.sent_bytes
    sends, d = await counter.count(lambda: p.choose(req("a"), workers))
    assert (sends, d.worker_id, d.overlap_blocks) == (1, "w1", 10)
    assert counter.sent_bytes - before < 1500  # the prompt's chain and the request, not 64 workers' columns
    p.release("a")
    await p.flush()  # the release's write goes now, not inside the count below
    await counter.client.delete(*stored)  # expired, or Redis restarted
    before = counter.sent_bytes
    sends, d = await counter.count(lambda: p.choose(req("b"), workers))
    assert (sends, d.worker_id, d.overlap_blocks) == (2, "w1", 10)
    assert counter.sent_bytes - before > 7000  # the table again
    assert await counter.client.keys(keys.router_table("m", "*")) == stored
    sums = np.frombuffer(await counter.client.get(keys.router_inflight("m")), dtype=">u4").reshape(-1, 2)
    assert sums.sum(axis=0).tolist() == [10, 0]  # b only: a's release applied once, b recorded once
    refreshed = [dataclasses.replace(w, load=dataclasses.replace(w.load, active_blocks=i % 3))  # new loads
                 for i, w in enumerate(workers)]
    assert (await p.choose(req("c"), refreshed)).worker_id != "w1"  # w1 is busy with b
    now = await counter.client.keys(keys.router_table("m", "*"))
    assert len(now) == 1 and now != stored
    await p.aclose()


async def test_a_prepared_table_is_stored_before_the_first_decision(counter: RoundTripCounter, keys: Keys,
                                                                    index: PrefixIndex) -> None:
    """``prepare`` (the directory's refresh) stores a snapshot's table and drops the one it replaces, so even the
    first decision over the snapshot sends only the table's id; a failed store leaves it to that decision."""
    await index.resync("w1", 1, "m", chain(PROMPT), 0)
    workers = [make_worker(f"w{i}", i) for i in range(64)]
    p = policy(counter.client, keys)
    await p.prepare("m", workers)
    stored = await counter.client.keys(keys.router_table("m", "*"))
    assert len(stored) == 1 and 0 < await counter.client.pttl(stored[0]) <= ROUTER_TABLE_TTL_MS
    await p.choose(RouteRequest("warm", "m2", PROMPT), [make_worker("x", 70)])  # loads the script (another model's table)
    p.release("warm")
    await p.flush()
    before = counter.sent_bytes
    sends, d = await counter.count(lambda: p.choose(req("a"), workers))
    assert (sends, d.worker_id, d.overlap_blocks) == (1, "w1", 10)
    assert counter.sent_bytes - before < 1500  # the id, not 64 workers' columns
    p.release("a")
    await p.flush()  # the release's write goes now, not inside the count below
    refreshed = [dataclasses.replace(w, load=dataclasses.replace(w.load, active_blocks=i % 3))  # new loads
                 for i, w in enumerate(workers)]
    await p.prepare("m", refreshed)
    now = await counter.client.keys(keys.router_table("m", "*"))
    assert len(now) == 1 and now != stored  # the new snapshot's table replaced the old one
    await counter.client.delete(*now)  # the store "failed": the decision stores the table itself
    sends, d = await counter.count(lambda: p.choose(req("b"), refreshed))
    assert sends == 2 and d.worker_id == "w1"
    await p.aclose()


async def test_a_stored_table_decides_as_the_columns_sent_with_it(aredis: aioredis.Redis, keys: Keys,
                                                                 index: PrefixIndex) -> None:
    """A decision over a table Redis already holds (the usual case) answers as the numpy oracle."""
    rng = random.Random(9)
    workers = [_timed(make_worker(f"w{i}", i, active_blocks=rng.randrange(0, 40), block_size=rng.choice([4, 8])), rng)
               for i in range(12)]
    for w in workers:
        held = chain(PROMPT, w.record.block_size)
        await index.resync(w.record.worker_id, w.record.slot, "m", held[: rng.randrange(len(held) + 1)], 0)
    for cost in ("blocks", "time"):
        draws = random.Random()
        warm = KvPolicy(aredis, keys, RouterSettings(cost=cost), rng=draws)
        await warm.choose(req(f"warm-{cost}"), workers)
        warm.release(f"warm-{cost}")
        await warm.flush()
        for k in range(5):
            request = req(f"{cost}{k}", temperature=[0.0, 2.0][k % 2])
            expected = await oracle_best(KvPolicy(aredis, keys, RouterSettings(cost=cost)), request, workers,
                                         random.Random(k).random())
            draws.seed(k)
            assert await warm.choose(request, workers) == expected
            warm.release(f"{cost}{k}")
            await warm.flush()
        await warm.aclose()


async def test_choose_enqueues_the_task_on_the_chosen_queue_once(counter: RoundTripCounter, keys: Keys,
                                                                 index: PrefixIndex) -> None:
    await index.resync("w1", 1, "m", chain(PROMPT), 0)
    workers = [make_worker("w0", 0), make_worker("w1", 1)]
    p = policy(counter.client, keys)
    await p.choose(req("warm"), workers)  # loads the script
    task = TaskParts(b'{"head":"', b'"}')
    # The factory's queue names are not namespaced; their lists are, under the broker prefix.
    w0, w1 = keys.broker_queue_list("q.w0"), keys.broker_queue_list("q.w1")
    await counter.client.delete(w0, w1)
    try:
        sends, d = await counter.count(lambda: p.choose(RouteRequest("r1", "m", PROMPT, task=task), workers))
        assert (sends, d.worker_id, d.queue, d.enqueued) == (1, "w1", "q.w1", True)  # routed and enqueued at once
        assert await counter.client.lrange(w1, 0, -1) == [b'{"head":"q.w1"}']
        # The same request decided again (a call repeated after a lost reply) is not enqueued twice.
        await p.choose(RouteRequest("r1", "m", PROMPT, task=task), workers)
        assert await counter.client.llen(w1) == 1 and await counter.client.llen(w0) == 0
        d = await p.choose(req("r2"), workers)  # no task: nothing enqueued
        assert not d.enqueued and await counter.client.llen(w1) == 1
    finally:
        await counter.client.delete(w0, w1)


async def test_overrides_pin_temperature_and_weight(aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    await index.resync("w0", 0, "m", chain(PROMPT), 0)
    workers = [make_worker("w0", 0, active_blocks=8), make_worker("w1", 1)]
    p = policy(aredis, keys)
    assert (await p.best(req("a"), workers)).worker_id == "w0"  # 0 + 8 < 10
    assert (await p.best(req("a", overlap_score_weight=0.0), workers)).worker_id == "w1"  # pure load: 8 > 0
    d = await p.best(req("a", worker_id="w1"), workers)
    assert (d.worker_id, d.cost) == ("w1", 10.0)
    picks = Counter([(await p.best(req("a", temperature=2.0), workers)).worker_id for _ in range(300)])
    # softmax(−[8, 10] / 2): w1 with probability 1 / (1 + e) ≈ 0.27
    assert 40 < picks["w1"] < 125 and picks["w0"] + picks["w1"] == 300


async def test_block_sizes_are_hashed_and_weighed_per_worker(aredis: aioredis.Redis, keys: Keys,
                                                             index: PrefixIndex) -> None:
    await index.resync("w8", 1, "m", chain(PROMPT, 8), 0)  # 5 blocks of 8, all cached
    workers = [make_worker("w4", 0, block_size=4), make_worker("w8", 1, block_size=8)]
    d = await policy(aredis, keys).best(req("a"), workers)
    assert (d.worker_id, d.overlap_blocks, d.cost) == ("w8", 5, 0.0)
    await index.purge("w8")
    await index.resync("w4", 0, "m", chain(PROMPT, 4)[:6], 0)
    d = await policy(aredis, keys).best(req("a"), workers)
    assert (d.worker_id, d.overlap_blocks, d.cost) == ("w4", 6, 4.0)  # w8 would cost (8 / 4) × 5 = 10


async def test_lora_separates_the_cache(aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    await index.resync("w0", 0, "m", chain(PROMPT, lora="ad1"), 0)
    workers = [make_worker("w0", 0)]
    p = policy(aredis, keys)
    assert (await p.best(req("a"), workers)).overlap_blocks == 0
    assert (await p.best(RouteRequest("b", "m", PROMPT, lora="ad1"), workers)).overlap_blocks == 10


async def test_bits_of_another_owner_are_ignored(aredis: aioredis.Redis, keys: Keys, index: PrefixIndex) -> None:
    await index.resync("ghost", 0, "m", chain(PROMPT), 0)  # dead, not purged yet; w0 now has its slot
    d = await policy(aredis, keys).best(req("a"), [make_worker("w0", 0)])
    assert d.overlap_blocks == 0


async def test_unreleased_predictions_expire(aredis: aioredis.Redis, keys: Keys) -> None:
    p = policy(aredis, keys, inflight_ttl_s=0.2)
    workers = [make_worker("w0", 0), make_worker("w1", 1)]
    first = (await p.choose(req("r1"), workers)).worker_id
    assert (await p.best(req("r2", worker_id=first), workers)).cost == 30.0  # (10 + 10 queued) + 10
    await asyncio.sleep(0.3)  # r1's frontend "died": nobody releases it
    d = await p.choose(req("r2", worker_id=first), workers)
    assert d.cost == 10.0  # r1 expired before r2 was decided
    slot = int(first[1])
    assert await aredis.bitfield(keys.router_inflight("m")).get("u32", f"#{2 * slot}").get(
        "u32", f"#{2 * slot + 1}").execute() == [10, 10]
    assert await aredis.zrange(keys.router_inflight_expiry("m"), 0, -1) == [b"r2"]


async def test_no_workers(aredis: aioredis.Redis, keys: Keys) -> None:
    with pytest.raises(NoWorkerAvailable):
        await policy(aredis, keys).choose(req("a"), [])


async def test_approximate_mode_records_decisions_with_ttl(aredis: aioredis.Redis, keys: Keys) -> None:
    p = policy(aredis, keys, approximate=True, approx_ttl_s=0.4)
    workers = [make_worker("w0", 0), make_worker("w1", 1)]
    chosen = (await p.choose(req("r1"), workers)).worker_id
    p.release("r1")
    await p.flush()
    d = await p.best(req("r2"), workers)
    assert (d.worker_id, d.overlap_blocks) == (chosen, 10)
    assert await aredis.zcard(keys.kv_worker_approx(chosen)) == 10

    async def forgotten() -> bool:
        await p.index.expire_guesses(["w0", "w1"])  # the reaper's sweep
        return (await p.best(req("r3"), workers)).overlap_blocks == 0

    await wait_for(forgotten, timeout_s=5)
    assert await aredis.zcard(keys.kv_worker_approx(chosen)) == 0
    assert await aredis.keys(keys.kv_block_prefix("m") + "*") == []


async def test_approximate_mode_caps_guesses_from_the_tail(aredis: aioredis.Redis, keys: Keys) -> None:
    p = policy(aredis, keys, approximate=True, approx_max_blocks=100)
    workers = [make_worker("w0", 0, kv_blocks=6)]
    await p.choose(req("r1"), workers)
    assert await aredis.zcard(keys.kv_worker_approx("w0")) == 6
    assert (await p.best(req("r2"), workers)).overlap_blocks == 6  # the chain's head survived


async def test_approximate_guesses_are_purged_with_the_worker(aredis: aioredis.Redis, keys: Keys,
                                                              index: PrefixIndex) -> None:
    p = policy(aredis, keys, approximate=True)
    await p.choose(req("r1"), [make_worker("w0", 3)])
    assert await index.purge("w0") == 10
    assert await aredis.keys(keys.kv_block_prefix("m") + "*") == []
    assert await index.owners() == {}


def _timed(worker: LiveWorker, rng: random.Random) -> LiveWorker:
    """``worker`` with a step-time model of its own (or none yet), running requests and a KV size."""
    timing = "" if rng.random() < 0.2 else TimingModel(
        (rng.uniform(5, 30), rng.uniform(0.001, 0.05), rng.uniform(0, 1e-5)),
        (rng.uniform(1, 10), rng.uniform(0, 60), rng.uniform(-30, 0))).encode()
    return dataclasses.replace(worker, load=dataclasses.replace(
        worker.load, timing=timing, running=rng.randrange(0, 9), total_blocks=rng.choice([0, 30, 200, 1000]),
        cached_blocks=rng.choice([0, 25, 190, 999])))


@pytest.mark.parametrize("cost", ["blocks", "time"])
async def test_redis_decision_matches_the_pure_scoring(aredis: aioredis.Redis, keys: Keys,
                                                       index: PrefixIndex, cost: str) -> None:
    """choose() and best() compute the cost inside Redis; the oracle in numpy, from a plain read. Same
    state and same u: same answer (the block formula and the predicted time alike; for the time cost,
    workers with and without a fitted model, small step budgets so that prefills take several steps,
    caches that must evict)."""
    rng = random.Random(42)
    sizes = [4, 8, 16]
    for scenario in range(25):
        model_tokens = [rng.randrange(50) for _ in range(rng.randrange(16, 200))]
        workers = [_timed(make_worker(f"s{scenario}w{i}", i, active_blocks=rng.randrange(0, 40),
                                      block_size=rng.choice(sizes), max_batched_tokens=rng.choice([0, 16, 64, 8192])),
                          rng) for i in range(6)]
        for w in workers:
            held = chain(model_tokens, w.record.block_size)
            await index.resync(w.record.worker_id, w.record.slot, "m", held[: rng.randrange(len(held) + 1)], 0)
        seeder = policy(aredis, keys, seed=scenario)
        for k in range(rng.randrange(6)):
            pin = rng.choice(workers).record.worker_id
            await seeder.choose(req(f"s{scenario}p{k}", model_tokens[: rng.randrange(1, len(model_tokens))],
                                    worker_id=pin), workers)
        temperature = rng.choice([0.0, 0.0, 5.0])
        weight = rng.choice([0.0, 1.0, 2.5])
        knobs = {"temperature": temperature, "cost": cost,
                 **({"overlap_score_weight": weight} if cost == "blocks" else {})}
        settings = {"cost": cost, "decode_slowdown_weight": rng.choice([0.0, 0.05, 1.0]),
                    "eviction_weight": rng.choice([0.0, 0.5])}
        expected = await oracle_best(policy(aredis, keys, **settings), req("x", model_tokens, **knobs), workers,
                                     random.Random(1000 + scenario).random())
        dry = await policy(aredis, keys, seed=1000 + scenario, **settings).best(req("x", model_tokens, **knobs), workers)
        got = await policy(aredis, keys, seed=1000 + scenario, **settings).choose(req("x", model_tokens, **knobs),
                                                                                  workers)
        assert got == dry == expected
        await aredis.delete(keys.router_inflight("m"), keys.router_inflight_requests("m"),
                            keys.router_inflight_expiry("m"))
        for w in workers:
            await index.purge(w.record.worker_id)


@pytest.mark.parametrize("sizes", [(4,), (4, 8)])
async def test_every_candidate_gets_its_exact_run_on_a_long_prompt(aredis: aioredis.Redis, keys: Keys,
                                                                   index: PrefixIndex, sizes: tuple[int, ...]) -> None:
    """The deciding script searches the chain instead of reading every block: each of 64 workers
    holding its own prefix length (nothing, all, one block, and everything in between, some lengths
    shared) still gets exactly its run, whatever block size it has."""
    rng = random.Random(7)
    tokens = [rng.randrange(50_000) for _ in range(4 * 300 + 3)]  # 300 blocks of 4 (150 of 8) and a partial one
    workers, runs = [], {}
    for i in range(64):
        size = sizes[i % len(sizes)]
        held = chain(tokens, size)
        run = [0, len(held), 1, len(held) - 1][i] if i < 4 else rng.choice([rng.randrange(len(held)), 37 // size])
        workers.append(make_worker(f"w{i}", i, block_size=size))
        runs[f"w{i}"] = run
        await index.resync(f"w{i}", i, "m", held[:run], 0)
    p = policy(aredis, keys)
    for w in workers:
        d = await p.choose(req(f"pin-{w.record.worker_id}", tokens, worker_id=w.record.worker_id), workers)
        assert (d.worker_id, d.overlap_blocks) == (w.record.worker_id, runs[w.record.worker_id])
        p.release(f"pin-{w.record.worker_id}")
    await p.flush()
    expected = await oracle_best(policy(aredis, keys), req("free", tokens), workers, random.Random(0).random())
    assert await p.choose(req("free", tokens), workers) == expected
    await p.aclose()
