"""Workers killed with SIGKILL: their streams move to a live worker (or end with an error when none
is left), routing and /ready forget them in time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from sluice.devstack import Stack, wait_until
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
