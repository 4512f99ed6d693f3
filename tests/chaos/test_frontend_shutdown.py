"""SIGTERM on the frontend: it takes no new request, lets open streams finish up to its drain
deadline, ends the rest with an error event and ``[DONE]`` (their workers told to stop), and exits."""

from __future__ import annotations

import signal
import time

import httpx
import orjson
import pytest

from bench.devstack import wait_until
from tests.chaos.support import MODEL, own_stack, running


def _open(base_url: str, max_tokens: int) -> tuple[httpx.Client, httpx.Response]:
    client = httpx.Client(base_url=base_url, timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    resp = client.send(client.build_request("POST", "/v1/chat/completions", json=body), stream=True)
    assert resp.status_code == 200
    return client, resp


def _events(resp: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]


def test_sigterm_lets_open_streams_finish_and_takes_no_new_request(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1",)) as s:
        client, resp = _open(s.base_url, 400)  # a few seconds of tokens
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        s.signal("frontend", signal.SIGTERM)
        signalled = time.monotonic()
        rest = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        # The stream ran on after the signal, to its natural end.
        assert rest[-1] == "[DONE]" and time.monotonic() - signalled > 0.5
        chunks = [orjson.loads(e) for e in rest[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        client.close()
        proc = s.procs["frontend"]
        wait_until(lambda: not proc.alive(), 10, "the frontend to exit")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{s.base_url}/health", timeout=2)


def test_streams_still_open_at_the_drain_deadline_end_with_an_error_event(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1",),
                   frontend_env={"SLUICE_FRONTEND__DRAIN_TIMEOUT_S": "2"}) as s:
        client, resp = _open(s.base_url, 4000)  # about a minute of tokens
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        s.signal("frontend", signal.SIGTERM)
        signalled = time.monotonic()
        rest = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]"
        error = orjson.loads(rest[-2])["error"]
        assert error["code"] == "frontend_shutting_down" and error["type"] == "service_unavailable"
        assert 1.5 < time.monotonic() - signalled < 8
        assert len(rest) > 10  # tokens kept coming during the drain
        client.close()
        wait_until(lambda: not s.procs["frontend"].alive(), 10, "the frontend to exit")
        wait_until(lambda: running(s).get("w1") == 0, 5, "the worker to stop the request")
