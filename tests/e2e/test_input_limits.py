"""Hostile and malformed client input against the running stack (uvicorn, Redis, mocker workers):
each is answered with an OpenAI-shaped 4xx, never a 500, and the same keep-alive connection then
serves a good request (a 500 or a server-side close would drop it)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sluice.devstack import Stack
from tests.e2e.conftest import MODEL

MiB = 1024 * 1024
#: The frontend's default SLUICE_FRONTEND__MAX_BODY_BYTES.
MAX_BODY = 4 * MiB
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
JSON = {"content-type": "application/json"}


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        yield client


def local_port(r: httpx.Response) -> int:
    """The client-side port of the connection that carried ``r``."""
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def assert_openai_error(r: httpx.Response, status: int, *, code: str | None = None, param: str | None = None,
                        type_: str = "invalid_request_error") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == type_
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    return err


def assert_connection_still_serves(http: httpx.Client, bad: httpx.Response) -> None:
    """The connection that carried ``bad`` answers a good request next."""
    good = http.post("/v1/chat/completions", json=GOOD)
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["message"]["content"]
    assert local_port(good) == local_port(bad), "the server closed the connection after the error"


def chunked(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("size", [MAX_BODY + 1, 10 * 1000 * 1000])
def test_a_body_over_the_limit_is_413(http: httpx.Client, size: int) -> None:
    body = b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"x" * size + b'"}]}'
    r = http.post("/v1/chat/completions", content=body, headers=JSON)
    assert_openai_error(r, 413, code="request_too_large")
    assert_connection_still_serves(http, r)


def test_a_chunked_body_over_the_limit_is_413(http: httpx.Client) -> None:
    body = b'{"model": "smollm2", "prompt": "' + b"x" * (MAX_BODY + 1) + b'"}'
    r = http.post("/v1/completions", content=chunked(body), headers=JSON)
    assert "content-length" not in r.request.headers
    assert_openai_error(r, 413, code="request_too_large")
    assert_connection_still_serves(http, r)


def test_unknown_route_and_wrong_method(http: httpx.Client) -> None:
    r = http.get("/v1/nothing-here")
    assert_openai_error(r, 404, code="not_found")
    assert_connection_still_serves(http, r)
    r = http.get("/v1/chat/completions")
    assert_openai_error(r, 405, code="method_not_allowed")
    assert r.headers["allow"] == "POST"
    assert_connection_still_serves(http, r)
