"""A client that goes away mid-stream is aborted on the worker, and its KV blocks are freed."""

from __future__ import annotations

import time

import httpx
import orjson
import redis

from core.messages import decode_delta
from sluice.devstack import Stack, wait_until
from tests.e2e.conftest import MODEL


def test_disconnect_aborts_generation_on_the_worker(stack: Stack, redis_server) -> None:  # noqa: ANN001
    r = redis.Redis.from_url(redis_server.url)
    watcher = r.pubsub()
    watcher.psubscribe(f"sluice:{stack.namespace}:tok:*")  # sees what the worker sends after we left
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 4000, "stream": True}
    with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", json=body, timeout=30,
                      headers={"x-sluice-router": "worker_id=w2"}) as resp:
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                request_id = orjson.loads(line[6:])["id"].removeprefix("chatcmpl-")
                seen += 1
                if seen == 4:
                    break
    closed_at = time.monotonic()
    final = None
    deadline = closed_at + 10
    while final is None and time.monotonic() < deadline:
        msg = watcher.get_message(timeout=1)
        if msg and msg["type"] == "pmessage":
            delta = decode_delta(msg["data"])
            if delta.request_id == request_id and delta.is_last:
                final = delta
    abort_latency = time.monotonic() - closed_at
    assert final is not None, "the worker never ended the request"
    assert final.finish_reason == "abort"
    assert final.usage is not None and final.usage.completion_tokens < 4000
    assert abort_latency < 1.0, f"abort took {abort_latency * 1000:.0f} ms"

    def load_is_zero() -> bool:
        load = r.hgetall(f"sluice:{stack.namespace}:load:w2")
        return load.get(b"running") == b"0" and load.get(b"active_blocks") == b"0"
    wait_until(load_is_zero, 10, "w2 to report no running requests and no active KV blocks")
    watcher.close()
    r.close()
