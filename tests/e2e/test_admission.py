"""Admission control, as a user meets it: a flood beyond what the workers may have waiting gets an
immediate 429 with ``Retry-After`` (not a place in an unbounded queue), and the bound frees up as
requests get their first token or end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from bench.devstack import Stack, wait_until
from tests.e2e.conftest import MODEL
from tests.e2e.disagg_support import LONG


@pytest.fixture(scope="module")
def bounded(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    """One worker 100x slower than the timing model (four long prompts take seconds to prefill)
    behind a frontend that lets 4 requests wait per worker."""
    s = Stack(redis_url=redis_server.url, namespace=f"adm{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "0.01", "SLUICE_FRONTEND__MAX_WAITING_PER_WORKER": "4",
                         "SLUICE_FRONTEND__OVERLOAD_RETRY_AFTER_S": "2"})
    try:
        s.start_worker("w1")
        s.start_frontend()
        s.wait_ready(MODEL, workers=1)
        yield s
    finally:
        s.stop()


def _refusals(stack: Stack) -> float:
    text = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sluice_admission_refusals_total{"))


def test_a_flood_beyond_the_bound_is_refused_at_once_and_the_bound_frees_up(bounded: Stack) -> None:
    s = bounded
    with httpx.Client(base_url=s.base_url, timeout=60) as client:
        waiting = []
        try:
            for i in range(4):  # four long prompts: seconds before any first token
                body = {"model": MODEL, "prompt": f"{i} {LONG}", "max_tokens": 4, "stream": True}
                resp = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
                assert resp.status_code == 200
                waiting.append(resp)
            refused = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "2"
            error = refused.json()["error"]
            assert error["code"] == "overloaded" and error["type"] == "rate_limit_error"
            assert _refusals(s) == 1
            metrics = httpx.get(f"{s.base_url}/metrics", timeout=10).text
            assert 'sluice_admission_limit{limit="max_waiting_per_worker"} 4.0' in metrics
            assert "sluice_requests_waiting 4.0" in metrics
        finally:
            for resp in waiting:  # the clients leave: their requests are cancelled and stop counting
                resp.close()

        def admitted() -> bool:
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            return r.status_code == 200
        wait_until(admitted, 30, "a request to be admitted once the flood left")
