"""Workers killed with SIGKILL: streams end with an error, routing and /ready forget them in time."""

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


def test_sigkill_mid_stream_ends_the_stream_and_the_worker_leaves_routing(fragile_stack: Stack) -> None:
    s = fragile_stack
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me everything."}], max_tokens=4000, stream=True,
        extra_headers={"x-sluice-router": "worker_id=victim"})
    it = iter(stream)
    for _ in range(3):
        next(it)
    s.kill("victim")
    killed_at = time.monotonic()
    with pytest.raises(openai.APIError, match="victim"):
        for _ in it:
            pass
    assert time.monotonic() - killed_at < 8
    wait_until(lambda: s.ready_workers().get(MODEL) == 1, 5, "/ready to drop the dead worker")
    for _ in range(4):  # every request now goes to the survivor
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.choices[0].finish_reason == "length"

    s.kill("survivor")
    wait_until(lambda: httpx.get(f"{s.base_url}/ready").status_code == 503, 5, "/ready to report no worker")
    r = httpx.post(f"{s.base_url}/v1/chat/completions", timeout=10,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_worker_available"
