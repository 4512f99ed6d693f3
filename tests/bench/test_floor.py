"""The floor servers of bench.floor: a real Redis, a uvicorn frontend and stock Celery workers as
subprocesses; each streams the tokens asked for, and nothing of them outlives its stop."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from bench.devstack import Processes, RedisServer
from bench.floor.launch import start_celery, start_http
from bench.frontend_bench import chat_body
from bench.loadgen import run_load

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("kind", ["http", "celery"])
def test_a_floor_streams_every_request_and_stops_clean(kind: str) -> None:
    processes = Processes(prefix="sluice-floor-test-")
    redis = RedisServer()
    try:
        if kind == "http":
            server = start_http(processes)
        else:
            server = start_celery(processes, redis.start(), workers=2)
        run = asyncio.run(run_load(server.url, chat_body, concurrency=4, requests=12, timeout_s=60))
        assert [r.error for r in run.results if not r.ok] == []
        assert {r.tokens for r in run.results} == {16}
        assert sorted(server.processes.values()) == (
            ["frontend"] if kind == "http" else ["frontend", "redis", "worker0", "worker1"])
    finally:
        processes.stop()
        redis.stop()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in server.processes)
    assert not processes.workdir.exists()
