"""A client that goes away mid-stream is aborted on the worker, and its KV blocks are freed."""

from __future__ import annotations

import time

import httpx
import orjson
import redis

from bench.devstack import Stack, final_delta, read_then_disconnect, wait_until
from tests.e2e.conftest import MODEL


def test_disconnect_aborts_generation_on_the_worker(stack: Stack, redis_server) -> None:  # noqa: ANN001
    r = redis.Redis.from_url(redis_server.url)
    watcher = r.pubsub()
    watcher.psubscribe(f"sluice:{stack.namespace}:tok:*")  # sees what the worker sends after we left
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 4000, "stream": True}
    request_id = read_then_disconnect(stack.base_url, body, headers={"x-sluice-router": "worker_id=w2"})
    closed_at = time.monotonic()
    final = final_delta(watcher, request_id)
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


def test_a_request_past_its_deadline_is_aborted_on_the_worker(stack: Stack, redis_server) -> None:  # noqa: ANN001
    """A second frontend on the same workers whose requests may run one second: the stream ends with
    an error event and [DONE], and the worker aborts the request (its own deadline timer)."""
    short = Stack(redis_url=stack.redis_url, namespace=stack.namespace, model_path=stack.model_path,
                  env_extra={**stack.env_extra, "SLUICE_FRONTEND__REQUEST_TIMEOUT_S": "1"})
    r = redis.Redis.from_url(redis_server.url)
    watcher = r.pubsub()
    watcher.psubscribe(f"sluice:{stack.namespace}:tok:*")
    try:
        short.start_frontend()
        short.wait_ready(MODEL, workers=2)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "A story that never ends."}],
                "max_tokens": 4000, "ignore_eos": True, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", f"{short.base_url}/v1/chat/completions", json=body, timeout=30) as resp:
            assert resp.status_code == 200
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
        request_id = orjson.loads(events[0][6:])["id"].removeprefix("chatcmpl-")
        assert events[-1] == "data: [DONE]"
        error = orjson.loads(events[-2][6:])["error"]
        assert error["code"] == "timeout" and "deadline" in error["message"]
        final = final_delta(watcher, request_id)
        # The worker's own deadline timer stopped it: it says so (an error, not a finish reason).
        assert final is not None and final.finish_reason is None
        assert final.error is not None and final.error.type == "timeout"
        assert final.usage is not None and final.usage.completion_tokens < 4000
    finally:
        short.stop()
        watcher.close()
        r.close()
