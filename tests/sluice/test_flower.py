"""``sluice flower`` (sluice/flower.py): a Flower that starts before any worker is up logs no warning,
only one line saying so; a later inspection that no worker answers still warns."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest
from flower.inspector import Inspector

from bench.devstack import Processes, RedisServer, wait_until
from sluice.flower import NO_REPLY, START_UP_METHODS, START_UP_WINDOW_S, StartUpInspection
from tests.support.ports import free_port


def no_reply(method: str) -> logging.LogRecord:
    return logging.LogRecord("flower.inspector", logging.WARNING, "inspector.py", 98, NO_REPLY, (method,), None)


def test_the_start_up_warnings_become_one_line_and_later_ones_stay() -> None:
    keep = StartUpInspection()
    kept = [r for r in map(no_reply, ["conf", "active_queues", "registered", "stats"]) if keep.filter(r)]
    assert len(kept) == 1 and kept[0].levelno == logging.INFO and "no worker answered" in kept[0].getMessage()
    assert set(Inspector(None, None, 1.0).methods_to_inspect(None)) == START_UP_METHODS  # Flower's own list
    later = no_reply("stats")
    assert keep.filter(later) and later.levelno == logging.WARNING
    worker_page = no_reply("reserved")  # a worker's own page, not the start-up broadcast
    assert keep.filter(worker_page) and worker_page.levelno == logging.WARNING
    unreachable = logging.LogRecord("flower.inspector", logging.WARNING, "inspector.py", 91,
                                    "Inspect method %s failed: %s", ("stats", "Connection refused"), None)
    assert StartUpInspection().filter(unreachable) and unreachable.levelno == logging.WARNING


def test_a_first_warning_after_the_start_up_window_stays() -> None:
    now = [0.0]
    keep = StartUpInspection(clock=lambda: now[0])
    now[0] = START_UP_WINDOW_S + 1
    record = no_reply("stats")
    assert keep.filter(record) and record.levelno == logging.WARNING


@pytest.fixture
def processes() -> Iterator[Processes]:
    p = Processes(prefix="sluice-flower-")
    yield p
    p.stop()


def test_flower_started_before_any_worker_logs_no_warning(processes: Processes, redis_server: RedisServer,
                                                          namespace: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "FLOWER_"))}
    env.update(SLUICE_REDIS_URL=redis_server.url, SLUICE_NAMESPACE=namespace, PYTHONUNBUFFERED="1")
    flower = processes.spawn("flower", [sys.executable, "-m", "sluice", "flower", "--port", str(port)], env)
    flower.wait_serving(f"http://127.0.0.1:{port}/healthcheck", "Flower", timeout=60)
    wait_until(lambda: "no worker answered" in flower.tail(), 30, "Flower's start-up inspection to end")
    assert "Inspect method" not in flower.tail(200), flower.tail(200)
