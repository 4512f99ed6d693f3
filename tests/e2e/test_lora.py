"""LoRA adapters end to end on the mocker stack: loaded on every worker or on one, listed by
``/v1/models``, named by requests, routed only to workers that hold them, with their own KV blocks;
and every refusal as an OpenAI-shaped 4xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.devstack import Stack
from tests.chaos.support import own_stack
from tests.e2e.conftest import MODEL

PROMPT = "Tell me about the river Seine and the bridges of Paris, one by one, from east to west. " * 4


@pytest.fixture(scope="module")
def stack(redis_server, tokenizer_dir: Path) -> Iterator[Stack]:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1", "w2")) as s:
        yield s


def adapter_dir(tmp_path: Path, name: str) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "base_model_name_or_path": MODEL,
                                                       "target_modules": ["q_proj", "v_proj"]}))
    return str(d)


def post(stack: Stack, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{stack.base_url}{path}", json=body, headers=headers or {}, timeout=60)


def complete(stack: Stack, model: str, prompt: str = PROMPT, headers: dict | None = None) -> httpx.Response:
    return post(stack, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0},
                headers)


def test_an_adapter_loaded_everywhere_is_listed_and_served(stack: Stack, tmp_path: Path) -> None:
    r = post(stack, "/v1/load_lora_adapter", {"lora_name": "pirate", "lora_path": adapter_dir(tmp_path, "pirate")})
    assert r.status_code == 200 and "added successfully" in r.text, r.text
    models = {m["id"]: m for m in httpx.get(f"{stack.base_url}/v1/models", timeout=10).json()["data"]}
    assert models["pirate"]["parent"] == MODEL and models["pirate"]["pools"] == {"agg": 2}
    assert models[MODEL]["parent"] is None
    base, tuned = complete(stack, MODEL), complete(stack, "pirate")
    assert tuned.status_code == 200 and tuned.json()["model"] == "pirate"
    assert tuned.json()["choices"][0]["text"] != base.json()["choices"][0]["text"]
    assert {complete(stack, "pirate").headers["x-sluice-worker"] for _ in range(6)} == {"w1", "w2"}
    # Loading it again is refused, as vLLM does.
    again = post(stack, "/v1/load_lora_adapter", {"lora_name": "pirate", "lora_path": adapter_dir(tmp_path, "p2")})
    assert again.status_code == 400 and again.json()["error"]["code"] == "lora_exists"
    assert post(stack, "/v1/unload_lora_adapter", {"lora_name": "pirate"}).status_code == 200
    gone = complete(stack, "pirate")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert "pirate" not in {m["id"] for m in httpx.get(f"{stack.base_url}/v1/models", timeout=10).json()["data"]}


def test_an_adapter_on_one_worker_is_routed_only_there_with_its_own_blocks(stack: Stack, tmp_path: Path) -> None:
    r = post(stack, "/v1/load_lora_adapter", {"lora_name": "w2-only", "lora_path": adapter_dir(tmp_path, "a"),
                                              "worker_id": "w2"})
    assert r.status_code == 200, r.text
    try:
        assert {complete(stack, "w2-only", f"{i} {PROMPT}").headers["x-sluice-worker"] for i in range(8)} == {"w2"}
        # The adapter's blocks are its own: the base model's cached prompt is no hit for it, and back.
        pin = {"x-sluice-router": "worker_id=w2"}
        prompt = f"salted {PROMPT}"
        first = complete(stack, MODEL, prompt, pin).json()["usage"]
        assert complete(stack, MODEL, prompt, pin).json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        tuned = complete(stack, "w2-only", prompt).json()["usage"]
        assert tuned["prompt_tokens"] == first["prompt_tokens"]
        assert tuned["prompt_tokens_details"]["cached_tokens"] == 0
        assert complete(stack, "w2-only", prompt).json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # Asked to run on the worker without it, the request is refused rather than served by the base model.
        elsewhere = complete(stack, "w2-only", headers={"x-sluice-router": "worker_id=w1"})
        assert elsewhere.status_code == 503, elsewhere.text
    finally:
        assert post(stack, "/v1/unload_lora_adapter", {"lora_name": "w2-only"}).status_code == 200


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), [
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent/adapter"}, 400, "lora_not_found",
     "lora_path"),
    ("/v1/load_lora_adapter", {"lora_name": MODEL, "lora_path": "/tmp"}, 400, None, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp", "model": "nope"}, 404, "model_not_found",
     "model"),
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp", "worker_id": "w9"}, 400, None, "worker_id"),
    ("/v1/load_lora_adapter", {"lora_name": "bad name", "lora_path": "/tmp"}, 400, None, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "x"}, 400, None, "lora_path"),
    ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, 400, "lora_not_found", "lora_name"),
])
def test_bad_adapter_requests_are_openai_errors(stack: Stack, path: str, body: dict, status: int, code: str | None,
                                                param: str) -> None:
    r = post(stack, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    if code:
        assert err["code"] == code
    assert "x" not in {m["id"] for m in httpx.get(f"{stack.base_url}/v1/models", timeout=10).json()["data"]}
