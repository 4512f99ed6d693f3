"""The local connector with real ``sluice worker`` processes (mocker): it starts them, they register,
scaling down drains the newest (SIGTERM) until it exits, a new connector adopts the running ones from
the state file, and ``stop_all`` leaves nothing behind."""

from __future__ import annotations

import asyncio
import sys
import uuid

import redis.asyncio as aioredis

from bench.devstack import with_parent_death_signal
from core.keys import Keys
from core.pools import Pool
from planner.connectors.base import PoolRef
from planner.connectors.local import LocalConnector
from router.registry import Registry

MODEL = "smollm2"
AGG = PoolRef(MODEL, Pool.AGG)


def env(redis_url: str, namespace: str, tokenizer_dir) -> dict[str, str]:  # noqa: ANN001
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return {**base, "SLUICE_REDIS_URL": redis_url, "SLUICE_NAMESPACE": namespace,
            "SLUICE_MODEL_PATH": str(tokenizer_dir), "SLUICE_WORKER__METRICS_PORT": "-1",
            "SLUICE_WORKER__TASK_EVENTS": "false", "PYTHONUNBUFFERED": "1"}


async def live(redis: aioredis.Redis, keys: Keys) -> dict[str, bool]:
    """Live worker ids -> draining."""
    return {w.record.worker_id: w.load.draining for w in await Registry(redis, keys).live_workers(MODEL)}


async def until(check, timeout: float = 90.0) -> None:  # noqa: ANN001
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.2)


async def test_workers_start_drain_and_are_adopted(redis_server, tokenizer_dir, tmp_path) -> None:  # noqa: ANN001
    namespace = f"t{uuid.uuid4().hex[:8]}"
    keys = Keys(namespace)
    redis = aioredis.from_url(redis_server.url)
    command = with_parent_death_signal([sys.executable, "-m", "sluice", "worker", "--log-level", "warning"])
    connector = LocalConnector(tmp_path, command, env(redis_server.url, namespace, tokenizer_dir))
    try:
        await connector.scale(AGG, 2, "test")
        assert await connector.current(AGG) == 2
        await until(lambda: _count(redis, keys, 2))
        names = sorted(await live(redis, keys))
        assert names == [f"{MODEL}-agg-1", f"{MODEL}-agg-2"]
        assert (tmp_path / f"{MODEL}-agg-1.log").exists()

        await connector.scale(AGG, 1, "test")  # the newest goes: SIGTERM, it drains and exits
        assert await connector.current(AGG) == 1
        await until(lambda: _gone(redis, keys, f"{MODEL}-agg-2"))
        await until(lambda: _reaped(connector))
        assert [w.name for w in connector.workers] == [f"{MODEL}-agg-1"]

        adopted = LocalConnector(tmp_path, command, {})  # a restarted planner's connector
        assert await adopted.current(AGG) == 1 and [w.name for w in adopted.workers] == [f"{MODEL}-agg-1"]
        await adopted.scale(AGG, 2, "test")  # numbering goes on
        assert sorted(w.name for w in adopted.workers) == [f"{MODEL}-agg-1", f"{MODEL}-agg-3"]
        await adopted.stop_all()
        assert adopted.workers == [] and await adopted.current(AGG) == 0
        connector.workers = []
    finally:
        await connector.stop_all(timeout_s=30)
        await redis.aclose()


async def _count(redis: aioredis.Redis, keys: Keys, n: int) -> bool:
    return len(await live(redis, keys)) == n


async def _gone(redis: aioredis.Redis, keys: Keys, name: str) -> bool:
    return name not in await live(redis, keys)


async def _reaped(connector: LocalConnector) -> bool:
    await connector.current(AGG)
    return all(not w.stopping for w in connector.workers)
