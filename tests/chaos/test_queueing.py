"""Nothing waits forever, nothing is lost before it starts: the queue-wait limit (429 and an error
event, with SSE pings keeping the connection meanwhile), and requests in ``pool`` mode moving off a
killed worker."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import orjson

from bench.devstack import wait_until
from tests.chaos.support import MODEL, chat_stream, client_of, migrations, own_stack, running, text_of


def test_a_request_no_worker_takes_in_time_gets_429_and_leaves_the_queue(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1",),
                   frontend_env={"SLUICE_FRONTEND__MAX_QUEUE_WAIT_S": "1.5", "SLUICE_FRONTEND__SSE_PING_S": "0.3"},
                   SLUICE_WORKER__CONCURRENCY="1", SLUICE_WORKER__MOCKER__MAX_NUM_SEQS="1") as s:
        busy = iter(chat_stream(client_of(s), 1000))  # w1 takes one request at a time: this one
        next(busy)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        t0 = time.monotonic()
        r = httpx.post(f"{s.base_url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] and r.json()["error"]["code"] == "queue_timeout"
        assert 1.4 < time.monotonic() - t0 < 5
        # Streamed: comment pings while it waits, then an error event and [DONE].
        with httpx.stream("POST", f"{s.base_url}/v1/chat/completions", json={**body, "stream": True},
                          timeout=30) as resp:
            lines = [line for line in resp.iter_lines() if line]
        pings = [line for line in lines if line.startswith(":")]
        data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        assert len(pings) >= 2
        assert data[-1] == "[DONE]" and orjson.loads(data[-2])["error"]["code"] == "queue_timeout"
        # Both refused requests were dropped: once the busy one ends, w1 runs nothing more.
        busy_tokens = sum(1 for _ in busy)
        assert busy_tokens > 0
        time.sleep(0.5)  # a dropped task would start at once on the freed worker
        wait_until(lambda: running(s).get("w1") == 0, 5, "w1 idle")


def test_pool_mode_streams_move_off_a_killed_worker_token_exactly(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, SLUICE_ROUTER_MODE="pool") as s:
        client = client_of(s)
        reference = [text_of(chat_stream(client, 300, f"story {i}")) for i in range(8)]
        streams = [iter(chat_stream(client, 300, f"story {i}")) for i in range(8)]
        heads = [[next(it) for _ in range(3)] for it in streams]
        s.kill("w1")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(lambda i: text_of([*heads[i], *streams[i]]), range(8)))
        assert texts == reference
        assert migrations(s) >= 1  # pool mode spread them: some ran on w1 and moved
