"""Flower, started as the Procfile starts it, sees the running workers."""

from __future__ import annotations

import httpx

from sluice.devstack import Stack, wait_until
from tests.support.ports import free_port


def test_flower_lists_the_workers(stack: Stack) -> None:
    port = free_port()
    stack._spawn("flower", ["flower", "--port", str(port)], stack.env())
    seen: set[str] = set()

    def workers_listed() -> bool:
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/api/workers", params={"refresh": "1"}, timeout=5)
        except httpx.HTTPError:
            return False
        if r.status_code != 200:
            return False
        seen.update(name.split("@")[0] for name in r.json())
        return {"w1", "w2"} <= seen
    try:
        wait_until(workers_listed, 60, "Flower to list w1 and w2", interval=0.5)
    finally:
        stack.kill("flower")
