"""The simple routing policies (pure)."""

from __future__ import annotations

import random

from router.policies import LeastLoadedPolicy, RandomPolicy, RoundRobinPolicy, RouteRequest
from router.registry import LiveWorker, WorkerLoad, WorkerRecord


def worker(wid: str, running: int = 0, waiting: int = 0) -> LiveWorker:
    rec = WorkerRecord(worker_id=wid, model="m", model_path="/m", pool="agg", queue=f"q.{wid}", pool_queue="q.pool",
                       engine="mocker", block_size=16, kv_blocks=100, max_num_seqs=8, context_length=1024,
                       started_at=0.0, slot=0)
    return LiveWorker(rec, WorkerLoad(running=running, waiting=waiting), 0.0)


def req(i: int) -> RouteRequest:
    return RouteRequest(f"r{i}", "m", [1, 2, 3])


async def test_round_robin_cycles_in_worker_order() -> None:
    p = RoundRobinPolicy()
    ws = [worker("b"), worker("a"), worker("c")]
    picks = [(await p.choose(req(i), ws)).worker_id for i in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


async def test_random_only_picks_live_workers() -> None:
    p = RandomPolicy(random.Random(1))
    ws = [worker("a"), worker("b")]
    picks = {(await p.choose(req(i), ws)).worker_id for i in range(50)}
    assert picks == {"a", "b"}


async def test_least_loaded_prefers_idle_and_counts_its_own_in_flight() -> None:
    p = LeastLoadedPolicy(random.Random(0))
    ws = [worker("a", running=3), worker("b", running=1), worker("c", running=1, waiting=1)]
    d1 = await p.choose(req(1), ws)
    assert d1.worker_id == "b" and d1.queue == "q.b"
    d2 = await p.choose(req(2), ws)  # b now has 1 in flight from us: still tied at 1 with heartbeat, c has 2
    assert d2.worker_id == "b"
    d3 = await p.choose(req(3), ws)  # b: max(1, 2) = 2 ties c: 2 -> either
    assert d3.worker_id in {"b", "c"}
    for r in ("r1", "r2", "r3"):
        p.release(r)
    assert (await p.choose(req(4), ws)).worker_id == "b"
