"""Decision plus enqueue with the routing state on the broker's Redis (one call) and apart from it
(two calls): the ``--split-index`` part of the router benchmark (bench/router_bench.py).

Both cases route the same prompts over the same candidates against the same filled index; each
sample is the time from the frontend's ``choose`` to the task message being on the chosen worker's
queue. Joined: the deciding script pushes it (one round trip). Split: the script decides on the index
Redis, then the frontend's enqueuer pushes it on a second Redis, the broker (two round trips, one
after the other). Both Redis servers run on this machine, on loopback. Queues and predictions are
cleared off the clock.
"""

from __future__ import annotations

import random
import time

import redis.asyncio as aioredis

from app.requests.enqueue import Enqueuer
from bench.stats import pct
from core.keys import Keys
from core.settings import RouterSettings
from core.wire import GENERATE_TASK, task_message_parts
from router.kv_policy import KvPolicy
from router.policies import RouteRequest
from router.registry import LiveWorker


async def _run(policy: KvPolicy, enqueuer: Enqueuer | None, queue_client: aioredis.Redis, keys: Keys,
               model: str, workers: list[LiveWorker], prompts: list[list[int]], rounds: int) -> list[float]:
    wall: list[float] = []
    for r in range(rounds):
        rid = f"split-{r}-{time.perf_counter_ns()}"
        task = task_message_parts(GENERATE_TASK, [{"request_id": rid}], task_id=rid, argsrepr=rid)
        req = RouteRequest(rid, model, prompts[r % len(prompts)], task=task)
        t0 = time.perf_counter()
        decision = await policy.choose(req, workers)
        if not decision.enqueued:
            assert enqueuer is not None
            await enqueuer.push(decision.queue, task.for_queue(decision.queue))
        wall.append((time.perf_counter() - t0) * 1000)
        policy.release(rid)
        await policy.flush()
        await queue_client.delete(keys.broker_queue_list(decision.queue))
    return wall


async def split_comparison(index_client: aioredis.Redis, broker_url: str, keys: Keys, model: str,
                           workers: list[LiveWorker], prompts: list[list[int]], rounds: int) -> dict:
    """p50/p99 of decision + enqueue, joined (one call) and split (two calls), in ms."""
    broker = aioredis.from_url(broker_url)
    joined = KvPolicy(index_client, keys, RouterSettings(), rng=random.Random(1))
    split = KvPolicy(index_client, keys, RouterSettings(), rng=random.Random(1), enqueues=False)
    try:
        await _run(joined, None, index_client, keys, model, workers, prompts, 20)  # warm-up
        await _run(split, Enqueuer(broker, keys), broker, keys, model, workers, prompts, 20)
        one = await _run(joined, None, index_client, keys, model, workers, prompts, rounds)
        two = await _run(split, Enqueuer(broker, keys), broker, keys, model, workers, prompts, rounds)
    finally:
        await joined.aclose()
        await split.aclose()
        await broker.aclose()
    return {"workers": len(workers), "tokens": len(prompts[0]), "samples": rounds,
            "joined_one_call_p50_ms": pct(one, 50), "joined_one_call_p99_ms": pct(one, 99),
            "split_two_calls_p50_ms": pct(two, 50), "split_two_calls_p99_ms": pct(two, 99)}
