"""The standalone router service's endpoints, through the ASGI app against a real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from bench.devstack import RedisServer
from core.keys import Keys
from core.settings import RedisSettings, Settings
from router.hashing import block_hashes, root_hash
from router.prefix_index import PrefixIndex
from router.registry import Registry, WorkerLoad
from router.service import create_app
from tests.router.factories import make_record

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "[UNK]"]
TEXT = "the quick brown fox jumps over the lazy dog the quick brown fox jumps over the lazy dog"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


@pytest.fixture
async def http(redis_server: RedisServer, redis_client, namespace: str) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    settings = Settings(redis=RedisSettings(url=redis_server.url, namespace=namespace))
    settings.router.registry_refresh_s = 0.001
    settings.router.cost = "blocks"  # the arithmetic below is the block formula's
    app = create_app(settings, reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            yield client


async def _register(aredis: aioredis.Redis, keys: Keys, worker_id: str, model_dir: Path, active: int = 0,
                    pool: str = "agg") -> int:
    record = await Registry(aredis, keys).register(
        make_record(worker_id, -1, model_path=str(model_dir), pool=pool),
        WorkerLoad(active_blocks=active, total_blocks=1000, updated_at=time.time()), 60)
    return record.slot


async def test_best_worker_by_token_ids_and_by_text(http: httpx.AsyncClient, aredis: aioredis.Redis, keys: Keys,
                                                    model_dir: Path) -> None:
    s0 = await _register(aredis, keys, "w0", model_dir)
    await _register(aredis, keys, "w1", model_dir, active=1)
    tokens = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(TEXT).ids
    assert len(tokens) == 18  # 4 full blocks of 4 and a partial one
    await PrefixIndex(aredis, keys).resync("w1", s0 + 1, "m", block_hashes(tokens, 4, root_hash("m")), 0)

    r = await http.post("/best_worker", json={"model": "m", "token_ids": tokens})
    assert r.status_code == 200
    assert r.json() == {"worker_id": "w1", "queue": "q.w1", "overlap_blocks": 4, "cost": 17.0}  # 16 × (5 − 4) + 1
    r = await http.post("/best_worker", json={"model": "m", "text": TEXT})
    assert r.json() == {"worker_id": "w1", "queue": "q.w1", "overlap_blocks": 4, "cost": 17.0}
    r = await http.post("/best_worker", json={"model": "m", "token_ids": tokens, "overlap_score_weight": 0})
    assert r.json()["worker_id"] == "w0"
    assert await aredis.exists(keys.router_inflight("m"), keys.router_inflight_requests("m")) == 0  # nothing routed


async def test_best_worker_picks_among_the_serving_workers_or_the_prefill_pool(
        http: httpx.AsyncClient, aredis: aioredis.Redis, keys: Keys, model_dir: Path) -> None:
    """As the frontend routes: a request goes to a decode or aggregated worker, never to a prefill worker,
    however much of the prompt the prefill worker holds; ``"pool": "prefill"`` asks for the prefill pool."""
    slot = await _register(aredis, keys, "p0", model_dir, pool="prefill")
    await _register(aredis, keys, "d0", model_dir, active=5, pool="decode")
    tokens = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(TEXT).ids
    await PrefixIndex(aredis, keys).resync("p0", slot, "m", block_hashes(tokens, 4, root_hash("m")), 0)
    r = await http.post("/best_worker", json={"model": "m", "token_ids": tokens})
    assert (r.json()["worker_id"], r.json()["overlap_blocks"]) == ("d0", 0)
    r = await http.post("/best_worker", json={"model": "m", "token_ids": tokens, "pool": "prefill"})
    assert (r.json()["worker_id"], r.json()["overlap_blocks"]) == ("p0", 4)
    await Registry(aredis, keys).deregister("p0")
    # The service sees the registry through its directory, refreshed in the background: wait for the refresh.
    deadline = time.monotonic() + 10
    while True:
        r = await http.post("/best_worker", json={"model": "m", "token_ids": tokens, "pool": "prefill"})
        if r.status_code != 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    assert r.status_code == 503 and "no live prefill worker" in r.json()["error"]["message"]
    r = await http.post("/best_worker", json={"model": "m", "token_ids": tokens, "pool": "decode"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "pool"


async def test_best_worker_answers_a_disaggregated_plan_as_the_frontend_would_make_it(
        http: httpx.AsyncClient, aredis: aioredis.Redis, keys: Keys, model_dir: Path) -> None:
    """With a prefill pool: the decode worker, why the prompt would (not) go to the prefill pool, and the
    prefill worker that would compute it; still nothing recorded."""
    await _register(aredis, keys, "d0", model_dir, pool="decode")
    slot = await _register(aredis, keys, "p0", model_dir, pool="prefill")
    tokens = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(TEXT).ids  # 18 tokens
    await PrefixIndex(aredis, keys).resync("p0", slot, "m", block_hashes(tokens, 4, root_hash("m")), 0)
    body = {"model": "m", "token_ids": tokens}
    assert (await http.post("/best_worker", json=body | {"disagg": "off"})).json() == {
        "worker_id": "d0", "queue": "q.d0", "overlap_blocks": 0, "cost": 80.0}  # 16 × 5 blocks
    auto = (await http.post("/best_worker", json=body)).json()  # the deployment's default: auto
    assert (auto["worker_id"], auto["disagg_reason"], "prefill" in auto) == ("d0", "short uncached prompt", False)
    for ask in ({"disagg": "on"}, {"disagg": "auto", "disagg_min_tokens": 10}):
        plan = (await http.post("/best_worker", json=body | ask)).json()
        assert (plan["worker_id"], plan["disagg_reason"]) == ("d0", "long uncached prompt")
        assert plan["prefill"] == {"worker_id": "p0", "queue": "q.p0", "overlap_blocks": 4, "cost": 16.0}  # 16 × (5 − 4)
    bad = await http.post("/best_worker", json=body | {"disagg": "maybe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "disagg"
    assert await aredis.exists(keys.router_inflight("m"), keys.router_inflight_requests("m")) == 0  # nothing routed


async def test_workers_lists_load_and_index_size(http: httpx.AsyncClient, aredis: aioredis.Redis, keys: Keys,
                                                 model_dir: Path) -> None:
    slot = await _register(aredis, keys, "w0", model_dir, active=7)
    await PrefixIndex(aredis, keys).resync("w0", slot, "m", [1, 2, 3], 0)
    body = (await http.get("/workers")).json()
    assert body["object"] == "list"
    (w,) = body["data"]
    assert (w["worker_id"], w["slot"], w["index_blocks"], w["kv_events"]) == ("w0", slot, 3, True)
    assert w["load"] == {"running": 0, "waiting": 0, "active_blocks": 7, "total_blocks": 1000, "kv_usage": 0.007}
    assert (await http.get("/workers", params={"model": "other"})).json()["data"] == []


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m"}, None),
    ({"model": "m", "token_ids": [1], "text": "x"}, None),
    ({"model": "m", "token_ids": [-1]}, "token_ids.0"),
    ({"model": "m", "token_ids": "nope"}, "token_ids"),
    ({"token_ids": [1]}, "model"),
    ({"model": "m", "token_ids": [1], "temperature": -1}, "temperature"),
])
async def test_bad_input_gets_an_openai_error(http: httpx.AsyncClient, body: dict, param: str | None) -> None:
    r = await http.post("/best_worker", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


async def test_no_worker_and_no_tokenizer(http: httpx.AsyncClient, aredis: aioredis.Redis, keys: Keys,
                                          tmp_path: Path) -> None:
    r = await http.post("/best_worker", json={"model": "m", "token_ids": [1, 2]})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_worker_available"
    await _register(aredis, keys, "w0", tmp_path / "empty")
    r = await http.post("/best_worker", json={"model": "m", "text": "hello"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "text" and "tokenizer" in r.json()["error"]["message"]
    r = await http.post("/best_worker", json={"model": "m", "token_ids": [1, 2]})
    assert r.json()["worker_id"] == "w0"


def test_run_serves_on_the_configured_port(redis_server: RedisServer, redis_client, namespace: str) -> None:  # type: ignore[no-untyped-def]
    """``run()`` (what ``sluice router`` calls) reads the settings from the environment and serves HTTP."""
    import os
    import subprocess
    import sys

    from bench.devstack import free_port, wait_until, with_parent_death_signal

    port = free_port()
    env = {**os.environ, "SLUICE_REDIS__URL": redis_server.url, "SLUICE_NAMESPACE": namespace,
           "SLUICE_ROUTER__PORT": str(port)}
    proc = subprocess.Popen(with_parent_death_signal([sys.executable, "-c", "from router.service import run; run()"]),
                            env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/workers", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, "the router service")
        r = httpx.post(f"http://127.0.0.1:{port}/best_worker", json={"model": "m", "token_ids": [1]}, timeout=5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_worker_available"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_clear_kv_blocks_reaches_the_workers_control_channels(http: httpx.AsyncClient, aredis: aioredis.Redis,
                                                                    keys: Keys) -> None:
    from core.messages import decode_control

    pubsub = aredis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.control_channel("w1"), keys.control_broadcast)
    try:
        for body, expected in (({"worker_id": "w1"}, keys.control_channel("w1")), ({}, keys.control_broadcast)):
            r = await http.post("/clear_kv_blocks", json=body)
            assert r.status_code == 200 and r.json() == {"workers_notified": 1}
            message = None
            for _ in range(5):  # subscribe confirmations come back as None first
                message = message or await pubsub.get_message(timeout=2)
            assert message is not None and message["channel"].decode() == expected
            assert decode_control(message["data"]).op == "clear_kv"
        r = await http.post("/clear_kv_blocks", json={"worker_id": "nobody"})
        assert r.json() == {"workers_notified": 0}
    finally:
        await pubsub.aclose()


async def test_clear_kv_blocks_goes_to_the_broker_when_the_routing_state_is_apart(
        redis_server: RedisServer, redis_client, namespace: str) -> None:  # type: ignore[no-untyped-def]
    """Workers listen for control commands on the broker's Redis (workers.control), wherever the routing
    state lives: the command must be published there, not on the index Redis."""
    from core.messages import decode_control

    index_server = RedisServer().start()
    broker = aioredis.Redis.from_url(redis_server.url)
    pubsub = broker.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(Keys(namespace).control_channel("w1"))
        settings = Settings(redis=RedisSettings(url=redis_server.url, index_url=index_server.url, namespace=namespace))
        app = create_app(settings, reaper=False)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
                r = await http.post("/clear_kv_blocks", json={"worker_id": "w1"})
        assert r.json() == {"workers_notified": 1}
        message = None
        for _ in range(5):  # the subscribe confirmation comes back as None first
            message = message or await pubsub.get_message(timeout=2)
        assert message is not None and decode_control(message["data"]).op == "clear_kv"
    finally:
        await pubsub.aclose()
        await broker.aclose()
        index_server.stop()
