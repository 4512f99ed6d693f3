"""``sluice planner`` with the local connector, as a user runs it beside a stack: it starts the pool's
workers itself, grows the pool under load, drains a worker when the load is gone without losing a
stream, and when it is killed the fleet stays as it is and a new planner resumes without acting at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from bench.devstack import Stack, wait_until
from bench.planner_bench import FleetCleanup
from core.keys import Keys
from planner.status import last_decisions
from router.registry import Registry

MODEL = "smollm2"


def planner_env(run_dir: Path) -> dict[str, str]:
    # Small KV caches: a few long streams fill a worker past the throughput mode's 0.8.
    return {"SLUICE_PLANNER__CONNECTOR": "local", "SLUICE_PLANNER__INTERVAL_S": "2",
            "SLUICE_PLANNER__FAST_INTERVAL_S": "0.5", "SLUICE_PLANNER__MAX_REPLICAS": "3",
            "SLUICE_PLANNER__COOLDOWN_INTERVALS": "1", "SLUICE_PLANNER__LOCK_TTL_S": "3",
            "SLUICE_PLANNER__LOCAL_DIR": str(run_dir), "SLUICE_PLANNER__METRICS_PORT": "-1",
            "SLUICE_PLANNER__WORKER_COMMAND": json.dumps([sys.executable, "-m", "sluice", "worker", "--log-level",
                                                          "warning"])}


def live(s: Stack) -> dict[str, bool]:
    """Live worker ids -> draining."""
    async def read() -> dict[str, bool]:
        client = aioredis.from_url(s.redis_url)
        try:
            return {w.record.worker_id: w.load.draining for w in await Registry(client, Keys(s.namespace)).live_workers()}
        finally:
            await client.aclose()
    return asyncio.run(read())


def decisions(s: Stack) -> list:
    async def read() -> list:
        client = aioredis.from_url(s.redis_url)
        try:
            return await last_decisions(client, Keys(s.namespace), 1000)
        finally:
            await client.aclose()
    return asyncio.run(read())


def stream(s: Stack, tokens: int, i: int) -> tuple[int, str | None]:
    """One streamed completion: the tokens generated (its usage event) and the error event, if any."""
    body = {"model": MODEL, "prompt": [200 + i] * 300, "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    got, error = 0, None
    with httpx.stream("POST", f"{s.base_url}/v1/completions", json=body, timeout=180) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    error = str(event["error"])
                if event.get("usage"):
                    got = event["usage"]["completion_tokens"]
    return got, error


def test_the_planner_follows_the_load_drains_and_survives_its_own_death(redis_server, tokenizer_dir, tmp_path) -> None:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"plan{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "4", "SLUICE_WORKER__MOCKER__KV_BLOCKS": "256",
                         "SLUICE_WORKER__METRICS_PORT": "-1", "SLUICE_WORKER__TASK_EVENTS": "false",
                         "SLUICE_ROUTER_MODE": "least_loaded"})
    cleanup = FleetCleanup(tmp_path)
    try:
        s.start_frontend()
        s.processes.spawn("planner", [sys.executable, "-m", "sluice", "planner", "--log-level", "info"],
                          s.env(**planner_env(tmp_path)))
        s.wait_ready(MODEL, workers=1, timeout=90)  # the planner started the pool's first worker

        # Load: 12 long streams of 300 + 400 tokens (44 blocks each) fill one worker's 256 blocks.
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(stream, s, 400, i) for i in range(12)]
            wait_until(lambda: len(live(s)) >= 2, 90, "the planner to grow the pool")
            results = [f.result() for f in futures]
        assert all(error is None and got == 400 for got, error in results), results  # no stream lost

        # The load is gone: after two quiet intervals the pool shrinks back, draining what it stops.
        wait_until(lambda: len([w for w, draining in live(s).items() if not draining]) == 1, 120,
                   "the planner to shrink the pool")
        ups = [p for d in decisions(s) for p in d.pools if p.action == "up"]
        downs = [p for d in decisions(s) for p in d.pools if p.action == "down"]
        assert downs and any("kv usage" in p.reason for p in ups)  # grown by the load, not only started
        # The frontend counted the decode's context: for requests of one shape, the prompt and half the answer.
        seen = [m.observed for d in decisions(s) if d.kind == "interval" for m in d.models
                if m.observed is not None and m.observed.isl]
        assert seen and all(o.context == pytest.approx(o.isl + o.osl / 2) for o in seen), seen

        # Killed: the fleet stays as it is; a new planner resumes its count and does not act at once.
        wait_until(lambda: len(live(s)) == 1, 120, "the drained workers to exit")
        before = live(s)
        last_tick = max(d.tick for d in decisions(s))
        s.kill("planner", signal.SIGKILL, alone=True)
        s.processes.spawn("planner-2", [sys.executable, "-m", "sluice", "planner", "--log-level", "info"],
                          s.env(**planner_env(tmp_path)))
        wait_until(lambda: any(d.tick > last_tick + 1 for d in decisions(s)), 60, "the new planner's intervals")
        assert live(s) == before
        resumed = [d for d in decisions(s) if d.tick > last_tick]
        assert all(p.action == "hold" for d in resumed for p in d.pools), resumed
        assert "resuming at interval" in s.procs["planner-2"].log.read_text()
    finally:
        s.stop()
        cleanup.stop()
