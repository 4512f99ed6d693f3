"""Start the floor servers (see :mod:`bench.floor`) as processes of their own, for the benchmarks."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from bench.devstack import Processes, RedisServer, free_port


@dataclass(frozen=True)
class FloorServer:
    """A running floor: its chat URL, the frontend's pid and each of its processes' role by pid."""

    url: str
    front_pid: int
    processes: dict[int, str]


def _uvicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "--factory", "bench.floor.frontend:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]


def start_http(processes: Processes) -> FloorServer:
    """The HTTP floor: one frontend process that answers at once."""
    port = free_port()
    proc = processes.spawn("floor-http", _uvicorn(port), dict(os.environ))
    proc.wait_serving(f"http://127.0.0.1:{port}/v1/models", "the floor frontend", 60)
    return FloorServer(f"http://127.0.0.1:{port}/v1/chat/completions", proc.popen.pid, {proc.popen.pid: "frontend"})


def start_celery(processes: Processes, redis: RedisServer, workers: int) -> FloorServer:
    """The Celery floor: one frontend process and ``workers`` stock Celery workers on ``redis``."""
    env = {**os.environ, "FLOOR_REDIS_URL": redis.url, "FLOOR_QUEUE": "floor"}
    roles = {}
    for i in range(workers):
        worker = processes.spawn(f"floor-worker{i}", [sys.executable, "-m", "celery", "-A", "bench.floor.worker", "worker",
                                                      "--pool", "threads", "-c", "32", "-l", "warning", "-n", f"floor{i}@%h",
                                                      "--without-gossip", "--without-mingle", "--without-heartbeat"], env)
        roles[worker.popen.pid] = f"worker{i}"
    port = free_port()
    front = processes.spawn("floor-celery", _uvicorn(port), env)
    front.wait_serving(f"http://127.0.0.1:{port}/v1/models", "the floor frontend", 60)
    assert redis.proc is not None
    return FloorServer(f"http://127.0.0.1:{port}/v1/chat/completions", front.popen.pid,
                       {front.popen.pid: "frontend", **roles, redis.proc.pid: "redis"})
