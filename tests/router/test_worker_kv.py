"""The worker side of KV-aware routing against a real Redis: a real engine host (the one a Celery
worker runs, minus Celery) with a mocker engine feeding the prefix index through its KV relay.

Every check waits for a condition (the index equal to the engine's cache), never for a time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from bench.devstack import RedisServer, wait_until
from core.keys import Keys
from core.messages import SamplingParams, TokenDelta, decode_deltas
from core.settings import MockerSettings, RouterSettings, Settings, WorkerSettings
from core.task_requests import GenerateRequest, request_to_builtins
from router.hashing import block_hashes, root_hash
from router.kv_policy import KvPolicy
from router.policies import RouteRequest
from router.prefix_index import PrefixIndex
from router.reaper import reap_dead_workers
from router.registry import Registry, WorkerIdentity
from workers.engines.mocker.engine import MockerEngine
from workers.host import EngineHost

MODEL = "m"
BLOCK = 4


def prompt(n: int, salt: int = 0) -> list[int]:
    return [100 + (salt * 7919 + i * 31) % 20000 for i in range(n)]


def settings_for(url: str, namespace: str, lease_ttl_s: float = 3.0) -> Settings:
    return Settings(redis_url=url, namespace=namespace, model=MODEL, worker=WorkerSettings(
        heartbeat_interval_s=0.1, lease_ttl_s=lease_ttl_s,
        mocker=MockerSettings(no_sleep=True, block_size=BLOCK, kv_blocks=64, max_num_seqs=8)))


def make_host(url: str, namespace: str, worker_id: str, *, kv_events: bool = True,
              lease_ttl_s: float = 3.0) -> EngineHost:
    s = settings_for(url, namespace, lease_ttl_s)
    keys = Keys(namespace)
    engine = MockerEngine(MODEL, s.worker.mocker, context_length=1024, kv_events=kv_events)
    identity = WorkerIdentity(worker_id=worker_id, model=MODEL, model_path="/nonexistent", pool="agg",
                              queue=keys.worker_queue(worker_id), pool_queue=keys.pool_queue(MODEL, "agg"))
    host = EngineHost(s, engine, identity)
    host.start()
    host.go_live()
    return host


def serve(host: EngineHost, tokens: list[int], max_tokens: int = 3) -> None:
    request = GenerateRequest(request_id=f"r{time.monotonic_ns()}", model=MODEL, token_ids=tokens,
                              sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True), reply_channel="nobody",
                              deadline=time.time() + 60)
    host.serve(request_to_builtins(request))


def engine_state(host: EngineHost) -> set[str]:
    hashes = host._call(_on_loop(host.engine.cached_block_hashes))
    return {f"{h:016x}" for h in hashes}


async def _on_loop(fn):  # type: ignore[no-untyped-def]
    return fn()


def index_state(client: redis.Redis, keys: Keys, worker_id: str) -> set[str]:
    return {h.decode() for h in client.smembers(keys.kv_worker(worker_id))}


def bitmaps_state(client: redis.Redis, keys: Keys, slot: int) -> set[str]:
    """Every block whose bitmap has the slot's bit set (what routers read)."""
    prefix = keys.kv_block_prefix(MODEL)
    return {k.decode()[len(prefix):] for k in client.scan_iter(match=prefix + "*", count=1000)
            if client.getbit(k, slot)}


def in_sync(host: EngineHost, client: redis.Redis, keys: Keys) -> bool:
    assert host.record is not None
    state = engine_state(host)
    return index_state(client, keys, host.identity.worker_id) == state == bitmaps_state(client, keys, host.record.slot)


@pytest.fixture
def host(redis_server: RedisServer, redis_client: redis.Redis, namespace: str) -> Iterator[EngineHost]:
    h = make_host(redis_server.url, namespace, "w1")
    yield h
    h.stop()


def test_events_from_a_serving_worker_reach_the_index(host: EngineHost, redis_client: redis.Redis,
                                                      namespace: str) -> None:
    keys = Keys(namespace)
    tokens = prompt(40)
    serve(host, tokens)
    wait_until(lambda: in_sync(host, redis_client, keys), 10, "the index to match the engine")
    chain = block_hashes(tokens, BLOCK, root_hash(MODEL))
    assert {f"{h:016x}" for h in chain} <= index_state(redis_client, keys, "w1")
    assert redis_client.xlen(keys.kv_events) >= 2  # the resync at go-live, then the request's batches
    serve(host, prompt(200, salt=1))  # more than the cache holds with the first prompt: evictions
    wait_until(lambda: in_sync(host, redis_client, keys), 10, "the index to follow evictions")
    raw = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.worker("w1")).items()}
    assert raw["kv_events"] == "True"


def replies(pubsub: redis.client.PubSub, until_last: float = 10.0) -> list[TokenDelta]:
    """The deltas on a subscribed reply channel up to the request's last one."""
    deadline, out = time.monotonic() + until_last, []
    while not (out and out[-1].is_last):
        assert time.monotonic() < deadline, f"no last delta within {until_last}s: {out}"
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is not None:
            out.extend(decode_deltas(message["data"]))
    return out


def test_a_worker_serves_the_previous_version_and_answers_an_unknown_one_with_an_error_event(
        host: EngineHost, redis_client: redis.Redis) -> None:
    pubsub = redis_client.pubsub()
    pubsub.subscribe("replies")
    wire = request_to_builtins(GenerateRequest(request_id="new", model=MODEL, token_ids=prompt(8), reply_channel="replies",
                                               sampling=SamplingParams(max_tokens=3, ignore_eos=True),
                                               deadline=time.time() + 60))
    # Version 1 (an old frontend): no role, no version, the role implied by its fields.
    v1 = {k: v for k, v in wire.items() if k not in ("role", "v", "lora", "frontend_id")} | {"request_id": "old"}
    host.serve(v1)
    served = replies(pubsub)
    assert served[-1].finish_reason == "length" and sum(len(d.token_ids) for d in served) == 3
    host.serve(wire | {"request_id": "future", "v": 3})  # a frontend newer than this worker
    refused = replies(pubsub)
    assert len(refused) == 1 and refused[0].request_id == "future" and refused[0].worker_id == "w1"
    assert refused[0].error is not None and refused[0].error.code == "unsupported_message"
    assert "version 3" in refused[0].error.message
    pubsub.close()


def test_gap_triggers_a_resync(host: EngineHost, redis_client: redis.Redis, namespace: str) -> None:
    keys = Keys(namespace)
    serve(host, prompt(40))
    wait_until(lambda: in_sync(host, redis_client, keys), 10, "the first request's blocks")
    redis_client.hset(keys.kv_worker_meta("w1"), "eid", 1)  # as if the batches after the go-live resync were lost
    stray = f"{123456789:016x}"
    redis_client.sadd(keys.kv_worker("w1"), stray)  # ...and holds something the engine does not
    serve(host, prompt(40, salt=2))  # its batch is refused as a gap: the worker republishes everything
    wait_until(lambda: in_sync(host, redis_client, keys), 10, "the resync after the gap")
    assert stray not in index_state(redis_client, keys, "w1")


def test_clear_kv_blocks_clears_the_workers_entries(host: EngineHost, redis_client: redis.Redis,
                                                    namespace: str, redis_server: RedisServer) -> None:
    from router.control import clear_kv_blocks

    keys = Keys(namespace)
    serve(host, prompt(40))
    wait_until(lambda: in_sync(host, redis_client, keys) and index_state(redis_client, keys, "w1"), 10, "blocks")

    async def clear() -> int:
        client = redis.asyncio.from_url(redis_server.url)
        try:
            return await clear_kv_blocks(client, keys, "w1")
        finally:
            await client.aclose()

    assert asyncio.run(clear()) == 1
    wait_until(lambda: not index_state(redis_client, keys, "w1") and not engine_state(host), 10, "an empty index")
    assert bitmaps_state(redis_client, keys, host.record.slot) == set()  # type: ignore[union-attr]


def test_shutdown_purges_and_a_dead_worker_is_reaped(redis_server: RedisServer, redis_client: redis.Redis,
                                                     namespace: str) -> None:
    keys = Keys(namespace)
    clean = make_host(redis_server.url, namespace, "clean")
    serve(clean, prompt(40))
    wait_until(lambda: in_sync(clean, redis_client, keys) and index_state(redis_client, keys, "clean"), 10, "blocks")
    clean.stop()
    assert index_state(redis_client, keys, "clean") == set()
    assert not redis_client.exists(keys.kv_worker_meta("clean"))

    dying = make_host(redis_server.url, namespace, "dying", lease_ttl_s=0.5)
    serve(dying, prompt(40, salt=3))
    wait_until(lambda: in_sync(dying, redis_client, keys) and index_state(redis_client, keys, "dying"), 10, "blocks")
    slot = dying.record.slot  # type: ignore[union-attr]
    for task in dying._background:  # the process hangs: no more heartbeats, nothing purged
        dying._loop.call_soon_threadsafe(task.cancel)

    async def reap() -> list[str]:
        client = redis.asyncio.from_url(redis_server.url)
        try:
            registry, index = Registry(client, keys), PrefixIndex(client, keys)
            while "dying" not in await registry.expired_workers():
                await asyncio.sleep(0.05)
            return await reap_dead_workers(registry, index, grace_s=0)
        finally:
            await client.aclose()

    assert asyncio.run(reap()) == ["clean", "dying"]  # the clean one ended its lease, the reaper forgets it
    assert index_state(redis_client, keys, "dying") == set() and bitmaps_state(redis_client, keys, slot) == set()
    dying.stop()


def test_resync_after_flushall() -> None:
    server = RedisServer().start()  # a private server: FLUSHALL must not touch the session's Redis
    client = redis.Redis.from_url(server.url)
    keys = Keys("flush")
    host = make_host(server.url, "flush", "w1")
    try:
        serve(host, prompt(40))
        wait_until(lambda: in_sync(host, client, keys) and index_state(client, keys, "w1"), 10, "blocks")
        client.flushall()  # as after a Redis restart: registration, index and scripts are gone
        wait_until(lambda: client.exists(keys.worker("w1")) and in_sync(host, client, keys), 10,
                   "the worker to register again and republish its cache")
        assert index_state(client, keys, "w1")
        lease_lost = host.metrics.registry.get_sample_value("sluice_kv_index_resyncs_total", {"reason": "lease_lost"})
        assert lease_lost and lease_lost >= 1  # the repair is counted, and the heartbeat's load record says so
        wait_until(lambda: int(client.hget(keys.load("w1"), "kv_resyncs") or 0) >= lease_lost, 10, "the count")
        serve(host, prompt(40, salt=4))  # and it keeps relaying afterwards
        wait_until(lambda: in_sync(host, client, keys), 10, "the next request's blocks")
    finally:
        host.stop()
        client.close()
        server.stop()


def test_a_lapsed_lease_drops_the_requests_from_before_it_and_keeps_those_taken_since() -> None:
    """Redis loses the registration (a restart, here FLUSHALL): at its next heartbeat the worker
    registers again and aborts what it was running before (its frontends moved or ended those), but
    not a request it took after Redis lost the lease: that one's frontend is waiting for it."""
    server = RedisServer().start()  # a private server: FLUSHALL must not touch the session's Redis
    client = redis.Redis.from_url(server.url)
    keys = Keys("lapse")
    s = Settings(redis_url=server.url, namespace="lapse", model=MODEL, worker=WorkerSettings(
        heartbeat_interval_s=0.2, lease_ttl_s=3.0, mocker=MockerSettings(block_size=BLOCK, kv_blocks=4096)))
    engine = MockerEngine(MODEL, s.worker.mocker, context_length=100_000)
    host = EngineHost(s, engine, WorkerIdentity(worker_id="w1", model=MODEL, model_path="/nonexistent", pool="agg",
                                                queue=keys.worker_queue("w1"), pool_queue=keys.pool_queue(MODEL, "agg")))
    pubsub = client.pubsub()
    try:
        host.start()
        host.go_live()
        pubsub.subscribe("before", "since")

        def start(request_id: str) -> None:  # minutes of tokens at the mocker's pace, on a task thread
            payload = request_to_builtins(GenerateRequest(
                request_id=request_id, model=MODEL, token_ids=prompt(16), reply_channel=request_id,
                sampling=SamplingParams(max_tokens=20_000, ignore_eos=True), deadline=time.time() + 120))
            threading.Thread(target=host.serve, args=(payload,), daemon=True).start()
            wait_until(lambda: request_id in running(), 10, f"{request_id} to run")

        def running() -> set[str]:
            return set(host._call(_on_loop(host.running.ids)))

        start("before")
        taken = time.time()
        # A heartbeat renewed the lease after "before" started: it is from before the lease lapsed.
        wait_until(lambda: float(client.hget(keys.load("w1"), "updated_at") or 0) > taken, 10, "a renewal")
        client.flushall()
        start("since")
        wait_until(lambda: client.exists(keys.worker("w1")), 10, "the worker to register again")
        ended = replies(pubsub, until_last=10.0)
        # It ends as lost (a frontend still reading it moves it on), not as a finished answer.
        last = ended[-1]
        assert last.request_id == "before" and last.finish_reason is None
        assert last.error is not None and last.error.type == "worker_lost"
        assert running() == {"since"}
    finally:
        pubsub.close()
        host.stop()
        client.close()
        server.stop()


def test_approximate_mode_for_a_worker_without_events(redis_server: RedisServer, redis_client: redis.Redis,
                                                      namespace: str) -> None:
    keys = Keys(namespace)
    host = make_host(redis_server.url, namespace, "quiet", kv_events=False)
    tokens = prompt(40)

    async def route_twice() -> tuple[int, int, int]:
        client = redis.asyncio.from_url(redis_server.url)
        try:
            registry = Registry(client, keys)
            policy = KvPolicy(client, keys, RouterSettings(approx_ttl_s=60))
            (worker,) = await registry.live_workers(MODEL)
            assert worker.record.kv_events is False
            first = await policy.choose(RouteRequest("a", MODEL, tokens), [worker])
            guesses = (await policy.index.sizes(["quiet"]))["quiet"]
            second = await policy.choose(RouteRequest("b", MODEL, tokens), [worker])
            policy.release("a")
            policy.release("b")
            await policy.flush()
            return first.overlap_blocks, guesses, second.overlap_blocks
        finally:
            await client.aclose()

    try:
        serve(host, tokens)
        assert index_state(redis_client, keys, "quiet") == set()  # the engine reported nothing
        first, guesses, second = asyncio.run(route_twice())
        assert (first, guesses, second) == (0, len(tokens) // BLOCK, len(tokens) // BLOCK)
        assert redis_client.zcard(keys.kv_worker_approx("quiet")) == len(tokens) // BLOCK
    finally:
        host.stop()
    assert redis_client.zcard(keys.kv_worker_approx("quiet")) == 0  # purged at shutdown
