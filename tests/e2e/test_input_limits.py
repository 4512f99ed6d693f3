"""Hostile and malformed client input against the running stack (uvicorn, Redis, mocker workers):
each is answered with an OpenAI-shaped 4xx, never a 500, and the same keep-alive connection then
serves a good request (a 500 or a server-side close would drop it)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.devstack import Stack
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


def raw(body: str) -> bytes:
    """A JSON body written by hand: ``\\ud800`` escapes reach the server as written."""
    return body.encode()


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**GOOD, "seed": 2**70}, "seed"),
    ("/v1/chat/completions", {**GOOD, "seed": -(2**63) - 1}, "seed"),
    ("/v1/chat/completions", {**GOOD, "stop_token_ids": [2, 2**70]}, "stop_token_ids.1"),
    ("/v1/chat/completions", {**GOOD, "max_tokens": 2**70}, "max_tokens"),
    ("/v1/chat/completions", {**GOOD, "max_completion_tokens": 2**64}, "max_completion_tokens"),
    ("/v1/chat/completions", {**GOOD, "min_tokens": 2**70}, "min_tokens"),
    ("/v1/chat/completions", {**GOOD, "n": 2**70}, "n"),
    ("/v1/chat/completions", {**GOOD, "logit_bias": {str(2**70): 1}}, f"logit_bias.{2**70}.[key]"),
    ("/v1/chat/completions", {**GOOD, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {**GOOD, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {**GOOD, "temperature": "0.5"}, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2**70]}, "prompt.token_ids.1"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "seed": 2**64}, "seed"),
])
def test_out_of_range_and_mistyped_fields_are_400_naming_the_field(http: httpx.Client, path: str, body: dict,
                                                                    param: str) -> None:
    r = http.post(path, json=body)
    assert_openai_error(r, 400, param=param)
    assert_connection_still_serves(http, r)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", '{"model": "smollm2", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages.0.content"),
    ("/v1/chat/completions",
     '{"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages.0.content.parts.0.text"),
    ("/v1/chat/completions", '{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stop": "\\ud800"}',
     "stop"),
    ("/v1/chat/completions", '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    ("/v1/completions", '{"model": "smollm2", "prompt": "\\ud800"}', "prompt.text"),
    ("/v1/completions", '{"model": "smollm2", "prompt": ["ok", "\\ud800"]}', "prompt.texts.1"),
    ("/v1/completions", '{"model": "smollm2", "prompt": "hi", "sluice": {"router": {"\\ud800": 1}}}',
     "sluice.router"),
])
def test_lone_surrogates_are_400(http: httpx.Client, path: str, body: str, param: str) -> None:
    r = http.post(path, content=raw(body), headers=JSON)
    assert_openai_error(r, 400, param=param)
    assert_connection_still_serves(http, r)


@pytest.mark.parametrize("body", [
    b'{"model": "smollm2", "prompt": "\xff\xfe"}',  # not UTF-8
    b'{"model": "smollm2", "prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested too deep
    b'{"model": "smollm2", "prompt": "hi", "temperature": NaN}',
    b'[1, 2]',
    b'null',
])
def test_malformed_bodies_are_400(http: httpx.Client, body: bytes) -> None:
    r = http.post("/v1/completions", content=body, headers=JSON)
    assert_openai_error(r, 400)
    assert_connection_still_serves(http, r)


@pytest.mark.parametrize("header", ["temperature=nan", "overlap_score_weight=inf", "disagg_min_tokens=inf"])
def test_non_finite_router_header_numbers_are_400(http: httpx.Client, header: str) -> None:
    r = http.post("/v1/chat/completions", json=GOOD, headers={"x-sluice-router": header})
    assert_openai_error(r, 400, param="x-sluice-router")
    assert_connection_still_serves(http, r)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x " * 1_500_000}]}, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": "x " * 1_500_000}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x " * 9000}, "prompt"),  # past the tokenizer
    ("/v1/completions", {"model": MODEL, "prompt": [1] * 9000}, "prompt"),
])
def test_prompts_beyond_the_context_are_400(http: httpx.Client, path: str, body: dict, param: str) -> None:
    r = http.post(path, json=body)
    assert_openai_error(r, 400, code="context_length_exceeded", param=param)
    assert_connection_still_serves(http, r)


def test_a_time_span_past_the_calendar_is_400(http: httpx.Client) -> None:
    r = http.get("/v1/usage", params={"since": "99999999999d"})
    assert_openai_error(r, 400, param="since")
    assert_connection_still_serves(http, r)


def test_a_small_request_is_served_while_a_maximal_prompt_is_tokenized(stack: Stack) -> None:
    """The largest prompt the frontend tokenizes (as many characters as could fit, each its own
    tokens: random CJK, about 4 MB of JSON) keeps a tokenizer busy for a second or more; requests
    sent meanwhile are answered before it."""
    rng = random.Random(0)
    content = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(663_000))
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]}).encode()
    assert 0.9 * MAX_BODY < len(big) <= MAX_BODY
    done: dict[str, float] = {}
    answer: list[httpx.Response] = []

    def send_big() -> None:
        with httpx.Client(base_url=stack.base_url, timeout=120) as client:
            answer.append(client.post("/v1/chat/completions", content=big, headers=JSON))
        done["big"] = time.monotonic()

    sender = threading.Thread(target=send_big)
    sender.start()
    time.sleep(0.2)
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        small = client.post("/v1/chat/completions", json=GOOD)
        done["small"] = time.monotonic()
    sender.join()
    assert small.status_code == 200, small.text
    assert_openai_error(answer[0], 400, code="context_length_exceeded", param="messages")
    assert done["small"] < done["big"], "the small request waited for the big one"


def test_an_idle_keep_alive_connection_outlives_a_client_pause(stack: Stack) -> None:
    """A connection idle for longer than uvicorn's default keep-alive (5 s) is still open: clients and
    proxies keep theirs longer (aiohttp 15 s), and a server that closes first races their next request
    on it, which then fails as a disconnect (SLUICE_FRONTEND__KEEP_ALIVE_S, 75 s)."""
    with httpx.Client(base_url=stack.base_url, timeout=60, limits=httpx.Limits(keepalive_expiry=60)) as http:
        first = http.get("/health")
        assert first.status_code == 200
        port = local_port(first)
        time.sleep(6)
        again = http.get("/health")
        assert again.status_code == 200 and local_port(again) == port
