"""Client mistakes a user can make, each answered with a clear OpenAI-shaped error (never a 500)
on a keep-alive connection that then serves the next good request; and a huge body that cannot
hold up anyone else."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from sluice.devstack import Stack
from tests.e2e.conftest import MODEL

GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _then_good(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json=GOOD)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**GOOD, "seed": 2**70}, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "seed": -(2**64)}, "seed"),
    ("/v1/chat/completions", {**GOOD, "stop_token_ids": [2**70]}, "stop_token_ids.0"),
    ("/v1/chat/completions", {**GOOD, "max_tokens": 2**40}, "max_tokens"),
    ("/v1/chat/completions", {**GOOD, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {**GOOD, "stream": "yes"}, "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 2**40]}, "prompt"),
])
def test_out_of_range_or_mistyped_fields_are_400_naming_the_field(stack: Stack, path: str, body: dict,
                                                                    param: str) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        r = client.post(path, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"].startswith(param), error
        _then_good(client)


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/chat/completions", b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),
    ("/v1/completions", b'{"model": "%s", "prompt": "x\\udfff"}', "prompt"),
])
def test_a_lone_surrogate_is_400(stack: Stack, path: str, raw: bytes, param: str) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        r = client.post(path, content=raw.replace(b"%s", MODEL.encode()),
                        headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"].startswith(param) and "surrogate" in error["message"], error
        _then_good(client)


def test_a_body_over_the_limit_is_413_before_it_is_read(stack: Stack) -> None:
    big = {"model": MODEL, "prompt": "x" * (5 * 1024 * 1024)}  # the default limit is 4 MiB
    r = httpx.post(f"{stack.base_url}/v1/completions", json=big, timeout=30)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"

    def chunks():  # noqa: ANN202 - no Content-Length: counted as it arrives
        yield b'{"model": "%s", "prompt": "' % MODEL.encode()
        for _ in range(80):
            yield b"y" * 65536
        yield b'"}'
    r = httpx.post(f"{stack.base_url}/v1/completions", content=chunks(), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        _then_good(client)


def test_a_prompt_far_beyond_the_context_is_refused_without_holding_up_others(stack: Stack) -> None:
    """3.9 MB of text (under the body limit) cannot fit 8,192 tokens: refused as too long without
    being tokenized, while a small request beside it is answered as usual."""
    huge = {"model": MODEL, "prompt": "word " * 780_000, "max_tokens": 1}
    result: dict[str, httpx.Response] = {}
    small_s: list[float] = []

    def send_huge() -> None:
        result["huge"] = httpx.post(f"{stack.base_url}/v1/completions", json=huge, timeout=60)

    t = threading.Thread(target=send_huge)
    t.start()
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        while t.is_alive() or not small_s:
            t0 = time.perf_counter()
            _then_good(client)
            small_s.append(time.perf_counter() - t0)
    t.join()
    r = result["huge"]
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt"
    print(f"small requests beside it: max {max(small_s) * 1000:.0f} ms over {len(small_s)}")


def test_405_names_the_allowed_methods_and_openapi_documents_the_errors(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        r = client.get("/v1/chat/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["code"] == "method_not_allowed"
        _then_good(client)
        spec = client.get("/openapi.json").json()
    responses = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "413", "429", "503"} <= set(responses)
    schema = responses["400"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(spec["components"]["schemas"][schema]["properties"]) == {"error"}
