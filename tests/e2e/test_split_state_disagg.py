"""Disaggregated prefill and the standalone router with the routing state apart from the broker, end to
end: ``sluice serve`` in ``kv`` mode, a prefill worker (``SLUICE_POOL=prefill``) and a decode worker
(``SLUICE_POOL=decode``) as ``sluice worker`` (mocker) subprocesses, and ``sluice router``, all with
``SLUICE_INDEX_REDIS_URL`` set; the Celery broker is the session's Redis. Each test runs on two layouts:
the routing state on a Redis of its own, and on a three-node Redis Cluster (tests.support.split_state).

What it shows, through HTTP and by reading both Redis: a long prompt is prefilled on the prefill worker
(the response names it; the decode worker's last delta, read off the broker's token channel, says it
read the whole prompt instead of computing it) and decoded on the decode worker, and its repeat stays
on the decode worker, which reports the prompt cached; every routing key (registry, prefix index,
in-flight predictions, candidate tables) is on the index Redis and none on the broker, which holds both
pools' Celery queues; ``sluice router`` lists both workers with their pools and index sizes, answers
``/best_worker`` from the index, and its ``/clear_kv_blocks`` reaches the workers (control commands
travel on the broker) and empties their part of the index.

Every wait polls a condition (the index holds the blocks, the workers are idle, the router answers);
no assertion depends on how fast anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from bench.devstack import RedisServer, final_delta, free_port, wait_until
from tests.e2e.conftest import MODEL
from tests.e2e.disagg_support import LONG
from tests.support.routing_state import wait_router, wait_workers_idle
from tests.support.split_state import LAYOUTS, SplitDeployment, assert_routing_state_apart, bound, split_deployment

PREFILL, DECODE = "p1", "d1"
POOLS = {PREFILL: "prefill", DECODE: "decode"}
BLOCK = 16  # the mocker's default block size
MIN_TOKENS = 512  # the remote-prefill threshold for this stack (the default is 2,048)
HEARTBEAT_S = 0.1
REFRESH_S = 0.05
#: About 300 tokens: under MIN_TOKENS, so the decode worker computes it itself.
SHORT = " ".join(f"entry {i}: the keeper opened the upper gate at dawn." for i in range(24))


@pytest.fixture(scope="module", params=LAYOUTS)
def deployment(request: pytest.FixtureRequest, redis_server: RedisServer,
               tokenizer_dir) -> Iterator[SplitDeployment]:  # noqa: ANN001
    env = {"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_ROUTER_MODE": "kv",
           "SLUICE_DISAGG__MIN_TOKENS": str(MIN_TOKENS),
           "SLUICE_WORKER__HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S), "SLUICE_ROUTER__REGISTRY_REFRESH_S": str(REFRESH_S)}
    workers = {name: {"SLUICE_POOL": pool} for name, pool in POOLS.items()}
    with split_deployment(request.param, redis_server.url, tokenizer_dir, MODEL, workers, env) as d:
        yield d


@pytest.fixture
def watcher(deployment: SplitDeployment) -> Iterator[redis.client.PubSub]:
    """A subscriber to every token channel of the namespace, on the broker."""
    w = deployment.broker.pubsub()
    w.psubscribe(deployment.keys.token_channel("*"))
    yield w
    w.close()


@pytest.fixture
def router(deployment: SplitDeployment) -> Iterator[str]:
    """``sluice router`` with the stack's environment (the routing state apart); its base URL."""
    port = free_port()
    proc = deployment.stack.start_router(port, SLUICE_ROUTER__REGISTRY_REFRESH_S=str(REFRESH_S))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_router(proc, url)
        yield url
    finally:
        deployment.stack.kill("router")


def complete(d: SplitDeployment, prompt: str, max_tokens: int = 24) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 7,
            "ignore_eos": True}
    r = httpx.post(f"{d.stack.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def prefilled_remotely(d: SplitDeployment, prompt: str) -> int:
    """Complete ``prompt`` (long: its prefill goes to the prefill worker) and wait until both workers'
    blocks for it are in the index; returns its prompt tokens."""
    r = complete(d, prompt)
    assert r.headers.get("x-sluice-prefill-worker") == PREFILL and r.headers["x-sluice-worker"] == DECODE
    blocks = r.json()["usage"]["prompt_tokens"] // BLOCK
    wait_until(lambda: min(d.index_blocks(w, MODEL) for w in POOLS) >= blocks, 30,
               "both workers' blocks of the prompt in the index")
    return int(r.json()["usage"]["prompt_tokens"])


def wait_idle(d: SplitDeployment) -> None:
    """Until both workers are idle on the index Redis and the frontend's snapshot has taken it in."""
    wait_workers_idle(d.index, d.keys, MODEL, POOLS, REFRESH_S)


def test_a_long_prompt_is_prefilled_remotely_and_its_repeat_is_served_cached(
        deployment: SplitDeployment, watcher: redis.client.PubSub) -> None:
    d = deployment
    prompt = LONG.replace("fox", f"fox of {d.layout}")
    first = complete(d, prompt)
    assert first.headers["x-sluice-prefill-worker"] == PREFILL and first.headers["x-sluice-worker"] == DECODE
    assert first.headers["x-sluice-disagg-reason"] == "long uncached prompt"
    usage = first.json()["usage"]
    assert usage["completion_tokens"] == 24 and usage["prompt_tokens"] > 1500
    final = final_delta(watcher, first.json()["id"].removeprefix("cmpl-"))
    assert final is not None and final.usage.transferred_tokens == usage["prompt_tokens"], \
        "the decode worker computed the prompt instead of reading it from the prefill worker"

    # The prefill worker's blocks (it computed them) and the decode worker's (it read them) are in the
    # index: the repeat finds the whole prompt on the decode worker, which keeps its prefill local.
    blocks = usage["prompt_tokens"] // BLOCK
    wait_until(lambda: min(d.index_blocks(w, MODEL) for w in POOLS) >= blocks, 30,
               "both workers' blocks of the prompt in the index")
    wait_idle(d)
    again = complete(d, prompt)
    assert "x-sluice-prefill-worker" not in again.headers and again.headers["x-sluice-worker"] == DECODE
    assert again.headers["x-sluice-disagg-reason"] == "short uncached prompt"  # what is left after the cached part
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    # Every full block but the one holding the last prompt token, which an engine always computes.
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == \
        (usage["prompt_tokens"] - 1) // BLOCK * BLOCK


def test_routing_state_is_on_the_index_redis_and_both_pools_queues_on_the_broker(
        deployment: SplitDeployment) -> None:
    d, k = deployment, deployment.keys
    prefilled_remotely(d, LONG.replace("dog", f"dog of {d.layout}"))
    on_index, on_broker = assert_routing_state_apart(d, MODEL, POOLS)
    assert any(name.startswith(k.router_table(MODEL, "")) for name in on_index), "no candidate table on the index"
    assert k.router_inflight(MODEL) in on_index
    for pool in POOLS.values():  # each pool's shared queue, which its workers consume besides their own
        assert bound(d.broker, k, k.pool_queue(MODEL, pool), k.pool_queue(MODEL, pool)), pool

    # A request in flight: its prediction is on the index (the prefill's and the decode's), not on the broker.
    body = {"model": MODEL, "prompt": LONG.replace("lazy", f"lazy {d.layout}"), "max_tokens": 2000,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{d.stack.base_url}/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["x-sluice-prefill-worker"] == PREFILL
        # One iterator kept open: leaving a ``for`` over ``resp.iter_lines()`` closes that generator, and
        # with it the connection; the frontend then ends the request and drops its prediction.
        lines = resp.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        assert d.index.hlen(k.router_inflight_requests(MODEL)) >= 1
        assert not d.broker.exists(k.router_inflight_requests(MODEL), k.router_inflight(MODEL))
    wait_idle(d)  # the frontend released the prediction when the client hung up


def test_the_router_service_reads_the_index_redis_and_reaches_the_workers_through_the_broker(
        deployment: SplitDeployment, router: str) -> None:
    d = deployment
    long_tokens = prefilled_remotely(d, LONG.replace("quick", f"quick {d.layout}"))
    short = complete(d, SHORT.replace("dawn", f"dawn, {d.layout}"))
    assert "x-sluice-prefill-worker" not in short.headers and short.headers["x-sluice-worker"] == DECODE
    short_tokens = short.json()["usage"]["prompt_tokens"]
    assert short_tokens < MIN_TOKENS and short_tokens // BLOCK >= 8
    wait_idle(d)

    def best(prompt: str, **extra: str) -> dict:
        r = httpx.post(f"{router}/best_worker", json={"model": MODEL, "text": prompt, **extra}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    # The short prompt only the decode worker computed; the long one both hold. The router service picks
    # among the workers that answer requests (decode and aggregated), as the frontend does, or among
    # the prefill pool when asked.
    short_prompt = SHORT.replace("dawn", f"dawn, {d.layout}")
    wait_until(lambda: best(short_prompt)["overlap_blocks"] == short_tokens // BLOCK, 30,
               "the router to see the short prompt's blocks")
    answer = best(short_prompt)
    assert answer["worker_id"] == DECODE and answer["queue"] == d.keys.worker_queue(DECODE)
    long_prompt = LONG.replace("quick", f"quick {d.layout}")
    answer = best(long_prompt)
    assert (answer["worker_id"], answer["overlap_blocks"]) == (DECODE, long_tokens // BLOCK)
    answer = best(long_prompt, pool="prefill")
    assert (answer["worker_id"], answer["overlap_blocks"]) == (PREFILL, long_tokens // BLOCK)
    assert answer["queue"] == d.keys.worker_queue(PREFILL)

    listing = httpx.get(f"{router}/workers", params={"model": MODEL}, timeout=10).json()["data"]
    assert [(w["worker_id"], w["pool"], w["kv_events"]) for w in listing] == \
        [(DECODE, "decode", True), (PREFILL, "prefill", True)]
    assert all(w["queue"] == d.keys.worker_queue(w["worker_id"]) and w["load"]["total_blocks"] > 0 for w in listing)
    assert {w["worker_id"]: w["index_blocks"] for w in listing} == {w: d.index_blocks(w, MODEL) for w in POOLS}
    assert all(w["index_blocks"] >= long_tokens // BLOCK for w in listing)

    # Control commands travel on the broker: each worker hears them, drops its cache, and its KV
    # events empty its part of the index.
    r = httpx.post(f"{router}/clear_kv_blocks", json={"worker_id": DECODE}, timeout=10)
    assert r.status_code == 200 and r.json() == {"workers_notified": 1}
    wait_until(lambda: d.index_blocks(DECODE, MODEL) == 0, 30, "the decode worker's blocks to leave the index")
    assert d.index_blocks(PREFILL, MODEL) >= long_tokens // BLOCK
    wait_until(lambda: best(short_prompt)["overlap_blocks"] == 0, 10, "the router to see the cleared cache")
    r = httpx.post(f"{router}/clear_kv_blocks", json={}, timeout=10)
    assert r.status_code == 200 and r.json() == {"workers_notified": len(POOLS)}
    wait_until(lambda: d.index_blocks(PREFILL, MODEL) == 0, 30, "the prefill worker's blocks to leave the index")
    listing = httpx.get(f"{router}/workers", params={"model": MODEL}, timeout=10).json()["data"]
    assert [w["index_blocks"] for w in listing] == [0, 0]
