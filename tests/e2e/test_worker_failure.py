"""Workers killed with SIGKILL: their streams move to a live worker (or end with an error when none
is left), routing and /ready forget them in time."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from bench.devstack import Stack, wait_until
from tests.e2e.conftest import MODEL


@pytest.fixture(scope="module")
def fragile_stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"kill{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1"})
    try:
        s.start_worker("victim")
        s.start_worker("survivor")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2)
        yield s
    finally:
        s.stop()


def _chat(client: openai.OpenAI, worker: str, max_tokens: int) -> openai.Stream:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me everything."}], max_tokens=max_tokens,
        stream=True, temperature=0, seed=3, extra_body={"ignore_eos": True},
        extra_headers={"x-sluice-router": f"worker_id={worker}"})


def _text(chunks) -> str:  # noqa: ANN001
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_sigkill_mid_stream_moves_the_stream_to_a_live_worker_and_the_dead_one_leaves_routing(
        fragile_stack: Stack) -> None:
    s = fragile_stack
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    reference = _text(_chat(client, "survivor", 400))
    it = iter(_chat(client, "victim", 400))
    head = [next(it) for _ in range(3)]
    s.kill("victim")
    # Once the victim's lease ends the request continues on the survivor from the tokens already
    # streamed: the client sees a pause, and the same text one worker gives.
    assert _text([*head, *it]) == reference
    wait_until(lambda: s.ready_workers().get(MODEL) == 1, 5, "/ready to drop the dead worker")
    for _ in range(4):  # every request now goes to the survivor
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.choices[0].finish_reason == "length"

    # With no worker left to move to, the stream ends with an error naming the lost worker.
    it = iter(_chat(client, "survivor", 4000))
    for _ in range(3):
        next(it)
    s.kill("survivor")
    killed_at = time.monotonic()
    with pytest.raises(openai.APIError, match="survivor"):
        for _ in it:
            pass
    assert time.monotonic() - killed_at < 8
    wait_until(lambda: httpx.get(f"{s.base_url}/ready").status_code == 503, 5, "/ready to report no worker")
    r = httpx.post(f"{s.base_url}/v1/chat/completions", timeout=10,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_worker_available"


@pytest.fixture(scope="module")
def slow_stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    """One worker 100x slower than the timing model (a 1,700-token prefill takes about 4 s, a
    decode step 0.6 s) behind a frontend whose stall clock is 2 s."""
    s = Stack(redis_url=redis_server.url, namespace=f"slow{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "0.01", "SLUICE_FRONTEND__STALL_TIMEOUT_S": "2"})
    try:
        s.start_worker("w1")
        s.start_frontend()
        s.wait_ready(MODEL, workers=1)
        yield s
    finally:
        s.stop()


def test_a_prefill_longer_than_the_stall_clock_is_not_a_stall(slow_stack: Stack) -> None:
    """The worker computes the prompt for twice the stall clock with nothing to send: its lease is
    live, so the frontend waits for the first token instead of calling the worker stalled."""
    from tests.e2e.disagg_support import LONG

    body = {"model": MODEL, "prompt": LONG, "max_tokens": 3, "ignore_eos": True}
    t0 = time.monotonic()
    r = httpx.post(f"{slow_stack.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert time.monotonic() - t0 > 2  # the prefill did outlast the stall clock


def test_a_live_worker_silent_mid_stream_is_a_stall(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    """After the first token, silence longer than the stall clock from a worker that still holds
    its lease (frozen: SIGSTOP, with a long lease) ends the stream with ``worker_stalled``."""
    s = Stack(redis_url=redis_server.url, namespace=f"stop{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_FRONTEND__STALL_TIMEOUT_S": "2"})
    try:
        s.start_worker("w1", SLUICE_WORKER__LEASE_TTL_S="60")
        s.start_frontend()
        s.wait_ready(MODEL, workers=1)
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
        it = iter(_chat(client, "w1", 4000))
        next(it)
        s.signal("w1", signal.SIGSTOP)
        try:
            with pytest.raises(openai.APIError, match="no tokens from the worker"):
                for _ in it:
                    pass
        finally:
            s.signal("w1", signal.SIGCONT)
    finally:
        s.stop()


def test_a_draining_worker_finishes_its_streams_and_gets_no_new_request(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    """SIGTERM (Celery's warm shutdown): the worker says ``draining`` at once, so new requests go to
    the other worker, and the stream it runs ends normally."""
    s = Stack(redis_url=redis_server.url, namespace=f"drain{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1"})
    try:
        s.start_worker("leaving")
        s.start_worker("staying")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2)
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
        reference = _text(_chat(client, "staying", 600))
        it = iter(_chat(client, "leaving", 600))
        head = [next(it) for _ in range(3)]
        s.signal("leaving", signal.SIGTERM)
        r = redis.Redis.from_url(redis_server.url)
        try:
            wait_until(lambda: r.hget(f"sluice:{s.namespace}:load:leaving", "draining") == b"True", 5,
                       "the leaving worker to say it drains")
        finally:
            r.close()
        wait_until(lambda: s.ready_workers().get(MODEL) == 1, 5, "/ready to count the draining worker out")
        for _ in range(6):  # every new request goes to the staying worker
            resp = httpx.post(f"{s.base_url}/v1/completions", timeout=30,
                              json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
            assert resp.status_code == 200 and resp.headers["x-sluice-worker"] == "staying"
        assert _text([*head, *it]) == reference  # the draining worker's stream ended normally
        metrics = httpx.get(f"{s.base_url}/metrics", timeout=10).text
        assert "sluice_request_migrations_total{" not in metrics, "a stream was moved off the draining worker"
        s.procs["leaving"].popen.wait(30)
    finally:
        s.stop()
