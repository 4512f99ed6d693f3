"""A worker killed with requests still in its own queue: the reaper forgets it whole (registration,
prefix-index entries, its queue with the messages in it, the queue's binding), a worker restarted under
its name starts with an empty queue, reapers in several processes run at once without harm, and a live
worker's queue is never touched, even while the worker is frozen and its queue fills up.

The stack: ``sluice serve`` (a reaper), ``sluice router`` (another reaper) and two ``sluice worker``
(mocker) on the session's Redis; the tests also sweep with reapers of their own, concurrently. The
requests left in a queue are task messages pushed the way a frontend pushes them, whose replies go to
a channel the test watches: a worker running one of them would publish there. Every wait polls a
condition with a generous deadline.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from bench.devstack import Stack, free_port, wait_until
from core.keys import Keys, broker_binding_member
from core.messages import SamplingParams, decode_deltas
from core.task_requests import GenerateRequest, request_to_builtins
from core.wire import GENERATE_TASK, task_message
from router.prefix_index import PrefixIndex
from router.reaper import Reaper
from router.registry import Registry
from tests.e2e.conftest import MODEL

#: The victim's lease: long enough that the test's pushes surely land while it still holds it.
VICTIM_LEASE_S = 5.0
#: The bystander is frozen (SIGSTOP) during a test: its lease must outlast the freeze.
BYSTANDER_LEASE_S = 120.0
PROMPT = "Summarise the history of lighthouses on the Atlantic coast, with dates and keepers' names. " * 8


@pytest.fixture(scope="module")
def stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"reap{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_ROUTER_MODE": "kv"})
    try:
        s.start_worker("victim", SLUICE_WORKER__LEASE_TTL_S=str(VICTIM_LEASE_S))
        s.start_worker("bystander", SLUICE_WORKER__LEASE_TTL_S=str(BYSTANDER_LEASE_S))
        s.start_frontend()
        s.processes.spawn("router", [sys.executable, "-m", "sluice", "router", "--port", str(free_port())], s.env())
        s.wait_ready(MODEL, workers=2)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def rdb(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def keys(stack: Stack) -> Keys:
    return Keys(stack.namespace)


def _complete(stack: Stack, worker: str, prompt: str = PROMPT) -> httpx.Response:
    r = httpx.post(f"{stack.base_url}/v1/completions", timeout=60,
                   headers={"x-sluice-router": f"worker_id={worker}"},
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-worker"] == worker
    return r


def _push_tasks(rdb: redis.Redis, keys: Keys, queue: str, reply_channel: str, n: int) -> list[str]:
    """Push ``n`` generate tasks the way a frontend does (LPUSH); the last onto a priority list, as
    Celery with priorities would. Returns their request ids."""
    lists = keys.broker_queue_lists(queue)
    ids = []
    for i in range(n):
        request = GenerateRequest(request_id=f"stale-{uuid.uuid4().hex[:8]}", model=MODEL, token_ids=[1, 2, 3, 4, 5],
                                  sampling=SamplingParams(max_tokens=2, ignore_eos=True), reply_channel=reply_channel,
                                  deadline=time.time() + 600)
        target = lists[1] if i == n - 1 else lists[0]
        rdb.lpush(target, task_message(GENERATE_TASK, [request_to_builtins(request)], queue,
                                       task_id=request.request_id))
        ids.append(request.request_id)
    return ids


def _queued(rdb: redis.Redis, keys: Keys, queue: str) -> int:
    return sum(rdb.llen(k) for k in keys.broker_queue_lists(queue))


def _bound(rdb: redis.Redis, keys: Keys, queue: str) -> bool:
    exchange = keys.pool_queue(MODEL, "agg")
    return any(rdb.sismember(k, broker_binding_member(queue)) for k in keys.broker_binding_sets(exchange))


def _traces(rdb: redis.Redis, keys: Keys, worker_id: str) -> list[str]:
    """Everything Redis still holds about the worker (keys naming it, its registry and index entries)."""
    found = [k.decode() for k in rdb.scan_iter(match=f"{keys.prefix}:*{worker_id}*", count=1000)]
    if rdb.zscore(keys.workers, worker_id) is not None:
        found.append("registry entry")
    if rdb.hexists(keys.worker_queues, worker_id):
        found.append("queue record")
    found += [f"registry slot {s.decode()}" for s, w in rdb.hgetall(keys.slots).items() if w.decode() == worker_id]
    found += [f"index slot {s.decode()}" for s, w in rdb.hgetall(keys.kv_slot_owners).items()
              if w.decode() == worker_id]
    if _bound(rdb, keys, keys.worker_queue(worker_id)):
        found.append("queue binding")
    return found


def _replies(watcher: redis.client.PubSub) -> set[str]:
    """Request ids of every delta published on the watched channel so far."""
    seen = set()
    while (msg := watcher.get_message(timeout=0.2)) is not None:
        if msg["type"] == "message":
            seen.update(d.request_id for d in decode_deltas(msg["data"]))
    return seen


async def _sweep_concurrently(url: str, keys: Keys, reapers: int) -> None:
    """Sweeps with ``reapers`` reapers of this process at once, each on its own connection (the real
    grace applies: the workers' leases decide)."""
    clients = [aioredis.from_url(url) for _ in range(reapers)]
    try:
        await asyncio.gather(*(Reaper(Registry(c, keys), PrefixIndex(c, keys)).sweep() for c in clients))
    finally:
        for c in clients:
            await c.aclose()


def test_a_killed_workers_queue_is_deleted_and_its_successor_starts_empty(
        stack: Stack, rdb: redis.Redis, keys: Keys) -> None:
    queue = keys.worker_queue("victim")
    _complete(stack, "victim")
    wait_until(lambda: rdb.scard(keys.kv_worker("victim")) > 0, 30, "the victim's blocks in the prefix index")
    assert _bound(rdb, keys, queue)  # its consumer declared the queue

    stack.kill("victim", signal.SIGKILL)
    watcher = rdb.pubsub(ignore_subscribe_messages=True)
    reply_channel = keys.token_channel(f"watch-{uuid.uuid4().hex[:8]}")
    watcher.subscribe(reply_channel)
    stale = _push_tasks(rdb, keys, queue, reply_channel, 4)
    assert rdb.exists(keys.worker("victim")), "the victim's lease ended before the test pushed its tasks"
    assert _queued(rdb, keys, queue) == 4

    # The frontend's and the router service's reapers sweep every 2 s; three more here, at once.
    def reaped() -> bool:
        asyncio.run(_sweep_concurrently(stack.redis_url, keys, reapers=3))
        return not _traces(rdb, keys, "victim")
    wait_until(reaped, 60, "the reapers to forget the killed worker", interval=0.2)
    assert _queued(rdb, keys, queue) == 0

    stack.start_worker("victim", SLUICE_WORKER__LEASE_TTL_S=str(VICTIM_LEASE_S))
    stack.wait_ready(MODEL, workers=2)
    _complete(stack, "victim", "a fresh request")  # served by the new victim...
    _complete(stack, "victim", "and another one")
    assert not _replies(watcher) & set(stale)  # ...which ran none of its predecessor's
    watcher.close()

    for name in ("frontend", "router"):  # the reapers that raced all along are fine
        proc = stack.procs[name]
        assert proc.alive(), proc.tail()
        assert "reaping dead workers failed" not in proc.tail(2000), proc.tail()


def test_a_live_worker_frozen_with_a_full_queue_keeps_it(stack: Stack, rdb: redis.Redis, keys: Keys) -> None:
    """SIGSTOP leaves the worker's lease live (its heartbeat stops, the lease has long to run): its
    queue fills, reapers sweep, nothing is deleted, and once thawed it serves every queued request."""
    queue = keys.worker_queue("bystander")
    watcher = rdb.pubsub(ignore_subscribe_messages=True)
    reply_channel = keys.token_channel(f"watch-{uuid.uuid4().hex[:8]}")
    watcher.subscribe(reply_channel)
    stack.signal("bystander", signal.SIGSTOP)
    try:
        queued = _push_tasks(rdb, keys, queue, reply_channel, 3)
        # The frozen consumer's pending BRPOP may have taken one (Redis answers it; the process reads
        # it once thawed); the rest stay in the queue.
        waiting = _queued(rdb, keys, queue)
        assert waiting >= 2
        for _ in range(3):
            asyncio.run(_sweep_concurrently(stack.redis_url, keys, reapers=3))
        assert _queued(rdb, keys, queue) == waiting and _bound(rdb, keys, queue)
        assert rdb.exists(keys.worker("bystander"))
    finally:
        stack.signal("bystander", signal.SIGCONT)
    seen: set[str] = set()

    def served() -> bool:
        seen.update(_replies(watcher))
        return set(queued) <= seen
    wait_until(served, 30, "the thawed worker to serve its queued requests")
    watcher.close()
