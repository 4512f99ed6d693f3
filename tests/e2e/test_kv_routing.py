"""KV-aware routing end to end: ``sluice serve`` in ``kv`` mode, two ``sluice worker`` (mocker)
subprocesses feeding the Redis prefix index, and the standalone ``sluice router`` service.

Every wait polls a condition (the index holds the blocks, a worker is live, the workers are idle); no
assertion depends on how fast anything runs. Streams kept open to hold load on a worker ask for
thousands of tokens (seconds of decoding at speedup 1) and are closed by the test as soon as it has
what it needs. Routing weighs the workers' heartbeat load, so a test that needs idle workers waits for
a heartbeat that reports them idle and then for the frontend's registry snapshot to take it in
(``wait_idle``: heartbeats every 0.1 s, snapshots every 0.05 s in this stack).
"""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from bench.devstack import Stack, free_port, wait_until
from core.keys import Keys
from tests.e2e.conftest import MODEL
from tests.support.routing_state import chat as routing_chat
from tests.support.routing_state import wait_router, wait_workers_idle

WORKERS = ("k1", "k2")
BLOCK = 16  # the mocker's default block size
HEARTBEAT_S = 0.1
REFRESH_S = 0.05
SYSTEM = ("You are the support assistant of a large online bookshop. Answer politely, cite the order number "
          "when there is one, never invent delivery dates, and keep every answer under one hundred words. ") * 6


@pytest.fixture(scope="module")
def kv_stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"kv{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_ROUTER_MODE": "kv",
                         "SLUICE_WORKER__HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
                         "SLUICE_ROUTER__REGISTRY_REFRESH_S": str(REFRESH_S)})
    try:
        for name in WORKERS:
            s.start_worker(name)
        s.start_frontend()
        s.wait_ready(MODEL, workers=len(WORKERS))
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def kv_client(kv_stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kv_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def rdb(kv_stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(kv_stack.redis_url)
    yield client
    client.close()


def index_blocks(rdb: redis.Redis, stack: Stack, worker: str) -> int:
    return int(rdb.scard(Keys(stack.namespace).kv_worker(worker)))


def wait_idle(rdb: redis.Redis, stack: Stack, settle_s: float = 0.0) -> None:
    """Until the workers are idle in the routing state and the frontend's snapshot has taken it in."""
    wait_workers_idle(rdb, Keys(stack.namespace), MODEL, WORKERS, REFRESH_S, settle_s)


#: How long both frontends get to take the idle loads in before a round of the two-frontend test. Its
#: outcome turns on the snapshots: a frontend whose snapshot still shows last round's request on the
#: other worker (its refresh loop late by more than the four refresh periods, 0.2 s, on a loaded 2-core
#: machine: seen once, both requests on k2) weighs that worker as busy and may join the first decision.
BOTH_SNAPSHOTS_S = 1.5


def chat(client: openai.OpenAI, messages: list[dict], **kw: object) -> tuple[str, str, int, int]:
    return routing_chat(client, MODEL, messages, **kw)


def test_two_frontends_routing_at_once_do_not_pile_on(kv_stack: Stack, rdb: redis.Redis) -> None:
    """Two frontend processes route one request each at the same moment, onto two idle workers, with a
    prompt cached nowhere. Each decision is recorded atomically in Redis before the other one reads the
    shared predictions, so the second sees the first worker busy (cost 3P against P) and takes the other:
    the pair always splits. Frontends that only knew their own requests would tie and pick at random,
    landing together half the time (all rounds passing by chance: 1 in 16)."""
    port = free_port()
    second = kv_stack._spawn("frontend2", ["serve", "--port", str(port), "--log-level", "warning"], kv_stack.env())
    clients = [httpx.Client(base_url=url, timeout=60) for url in (kv_stack.base_url, f"http://127.0.0.1:{port}")]
    try:
        wait_until(lambda: _ready(f"http://127.0.0.1:{port}", second), 60, "the second frontend")
        for round_no in range(4):
            wait_idle(rdb, kv_stack, BOTH_SNAPSHOTS_S)
            user = f"{uuid.uuid4().hex[:8]} round {round_no} " + "x " * 600  # about 40 blocks, cached nowhere
            barrier = threading.Barrier(2)

            def one(i: int, user: str = user, barrier: threading.Barrier = barrier) -> httpx.Response:
                barrier.wait()
                return _open_stream(clients[i], user, system=f"Round {user[:8]}. " + SYSTEM)

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                responses = list(pool.map(one, range(2)))
            try:
                assert [r.status_code for r in responses] == [200, 200]
                assert sorted(r.headers["x-sluice-worker"] for r in responses) == sorted(WORKERS)
            finally:
                for r in responses:
                    r.close()  # each frontend cancels its request and releases its prediction
        wait_idle(rdb, kv_stack)
    finally:
        for c in clients:
            c.close()
        kv_stack.kill("frontend2", signal.SIGTERM)


def _ready(url: str, proc) -> bool:  # type: ignore[no-untyped-def]
    if not proc.alive():
        raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
    try:
        return httpx.get(f"{url}/ready", timeout=2).json().get("models", {}).get(MODEL, 0) >= len(WORKERS)
    except (httpx.HTTPError, ValueError):
        return False


def test_follow_up_turns_land_on_the_worker_that_served_the_first(kv_client: openai.OpenAI, kv_stack: Stack,
                                                                  rdb: redis.Redis) -> None:
    conversations = [[{"role": "system", "content": f"Conversation {i}. " + SYSTEM[: 200 + 60 * i]},
                      {"role": "user", "content": f"Where is my order number {1000 + i}?"}] for i in range(4)]
    first: list[tuple[str, int]] = []
    wait_idle(rdb, kv_stack)
    for messages in conversations:
        worker, reply, prompt_tokens, _ = chat(kv_client, messages)
        assert worker in WORKERS
        messages.append({"role": "assistant", "content": reply})
        first.append((worker, prompt_tokens))
    for worker in {w for w, _ in first}:  # the workers' KV events have reached the index
        wait_until(lambda w=worker: index_blocks(rdb, kv_stack, w) >= min(p for x, p in first if x == w) // BLOCK,
                   30, f"the index to list {worker}'s blocks")
    for messages, (worker, prompt_tokens) in zip(conversations, first, strict=True):
        messages.append({"role": "user", "content": "And when will it arrive?"})
        wait_idle(rdb, kv_stack)  # the last request's load must not outweigh the cached prefix
        again, _, _, cached = chat(kv_client, messages)
        assert again == worker
        # usage reports what the engine reused: at least the first turn's full blocks, in whole blocks
        assert cached >= prompt_tokens // BLOCK * BLOCK and cached % BLOCK == 0


def _open_stream(http: httpx.Client, user: str, system: str = SYSTEM, max_tokens: int = 4000) -> httpx.Response:
    request = http.build_request("POST", "/v1/chat/completions", json={
        "model": MODEL, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    return http.send(request, stream=True)


def test_a_hot_shared_prefix_spreads_once_its_worker_is_loaded(kv_client: openai.OpenAI, kv_stack: Stack,
                                                               rdb: redis.Redis) -> None:
    system = f"Shop {uuid.uuid4().hex}. " + SYSTEM  # a prefix no earlier test cached anywhere
    wait_idle(rdb, kv_stack)
    warm, _, prompt_tokens, _ = chat(kv_client, [{"role": "system", "content": system},
                                                 {"role": "user", "content": "hello"}])
    wait_until(lambda: index_blocks(rdb, kv_stack, warm) >= prompt_tokens // BLOCK - 1, 30, "the warm prefix")
    wait_idle(rdb, kv_stack)
    streams: list[httpx.Response] = []
    with httpx.Client(base_url=kv_stack.base_url, timeout=60) as http:
        try:
            # Each stream stays in flight (4000 tokens) while the next one is routed; at the default
            # weight the cached worker takes several before its load outweighs the prefix.
            for i in range(24):
                response = _open_stream(http, f"question number {i}: is the book in stock?", system)
                assert response.status_code == 200
                streams.append(response)
                if response.headers["x-sluice-worker"] != warm:
                    break
            served = [r.headers["x-sluice-worker"] for r in streams]
        finally:
            for r in streams:
                r.close()  # the client leaves: the requests are cancelled and their predictions released
    assert served[0] == warm  # the cached worker wins while it is idle...
    assert set(served) == set(WORKERS)  # ...and once it is loaded, the other worker takes the prefix too
    assert len(served) >= 2


def test_router_parameters_and_errors(kv_stack: Stack) -> None:
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 2}
    with httpx.Client(base_url=kv_stack.base_url, timeout=60) as http:
        r = http.post("/v1/completions", json=body, headers={"x-sluice-router": "overlap_score_weight=2, temperature=0.5"})
        assert r.status_code == 200 and r.headers["x-sluice-worker"] in WORKERS
        r = http.post("/v1/completions", json={**body, "sluice": {"router": {"worker_id": "k2"}}})
        assert r.status_code == 200 and r.headers["x-sluice-worker"] == "k2"
        for headers, extra, param in [
            ({"x-sluice-router": "temperature=-1"}, {}, "x-sluice-router"),
            ({"x-sluice-router": "overlap_score_weight=lots"}, {}, "x-sluice-router"),
            ({"x-sluice-router": "bogus=1"}, {}, "x-sluice-router"),
            ({}, {"sluice": {"router": {"temperature": -2}}}, "sluice.router.temperature"),
            ({}, {"sluice": {"router": {"mode": "psychic"}}}, "sluice.router.mode"),
        ]:
            r = http.post("/v1/completions", json={**body, **extra}, headers=headers)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_streaming_names_the_worker(kv_client: openai.OpenAI) -> None:
    with kv_client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True) as response:
        assert response.headers["x-sluice-worker"] in WORKERS
        assert sum(1 for _ in response.iter_lines()) > 0


def test_standalone_router_service_against_live_workers(kv_stack: Stack, rdb: redis.Redis) -> None:
    port = free_port()
    proc = kv_stack.start_router(port)
    url = f"http://127.0.0.1:{port}"
    tokens = [1000 + (i * 37) % 30000 for i in range(200)]
    try:
        with httpx.Client(base_url=kv_stack.base_url, timeout=60) as http:
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": tokens, "max_tokens": 2})
            assert r.status_code == 200
            served = r.headers["x-sluice-worker"]
        wait_until(lambda: index_blocks(rdb, kv_stack, served) >= len(tokens) // BLOCK, 30, "the prompt's blocks")
        wait_router(proc, url)
        listing = httpx.get(f"{url}/workers", params={"model": MODEL}, timeout=10).json()
        by_id = {w["worker_id"]: w for w in listing["data"]}
        assert set(by_id) == set(WORKERS)
        assert by_id[served]["index_blocks"] >= len(tokens) // BLOCK and by_id[served]["kv_events"] is True
        assert by_id[served]["load"]["total_blocks"] > 0

        best = httpx.post(f"{url}/best_worker", json={"model": MODEL, "token_ids": tokens + [5, 6, 7]}, timeout=10)
        assert best.status_code == 200
        answer = best.json()
        assert answer["worker_id"] == served and answer["overlap_blocks"] == len(tokens) // BLOCK
        assert answer["queue"] == Keys(kv_stack.namespace).worker_queue(served)

        bad = httpx.post(f"{url}/best_worker", json={"model": MODEL}, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    finally:
        kv_stack.kill("router")
