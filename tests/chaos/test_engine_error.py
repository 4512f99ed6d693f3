"""An engine that fails a request mid-way (vLLM's ``FINISHED_ERROR``: a failed KV load, a grammar that
rejects the model's token), as the mocker's script makes one: the request continues on another worker,
and with none left the client gets an OpenAI-shaped 502, never a short answer with 200."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from bench.devstack import Stack, wait_until
from tests.chaos.support import MODEL, migrations, own_stack, running

FAILING = "please fail here"
SCRIPT = [{"match": FAILING, "output": "Half an answer", "finish": "error"}]


@pytest.fixture(scope="module")
def stack(redis_server, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: ANN001
    """w1's engine fails every request whose prompt says FAILING; w2's serves it."""
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with own_stack(redis_server.url, tokenizer_dir,
                   worker_env={"w1": {"SLUICE_WORKER__MOCKER__SCRIPT": str(script)}}) as s:
        yield s


def _body(stream: bool, max_tokens: int = 12) -> dict:
    return {"model": MODEL, "prompt": FAILING, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def test_the_request_moves_to_another_worker_and_completes(stack: Stack) -> None:
    before = migrations(stack)
    r = httpx.post(f"{stack.base_url}/v1/completions", json=_body(stream=False), timeout=60,
                   headers={"x-sluice-router": "worker_id=w1"})
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["text"].startswith("Half an answer") and choice["finish_reason"] == "length"
    assert usage["completion_tokens"] == 12
    assert migrations(stack) == before + 1
    wait_until(lambda: not any(running(stack).values()), 20, "both workers to be idle")


def test_when_it_may_not_move_the_client_gets_a_502_not_a_short_answer(stack: Stack) -> None:
    headers = {"x-sluice-router": "worker_id=w1, max_migrations=0"}
    r = httpx.post(f"{stack.base_url}/v1/completions", json=_body(stream=False), timeout=60, headers=headers)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "migration_limit" and error["type"] == "server_error"
    assert "engine ended the request with an error" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}

    with httpx.stream("POST", f"{stack.base_url}/v1/completions", json=_body(stream=True), timeout=60,
                      headers=headers) as resp:
        assert resp.status_code == 200  # the stream had started: the error comes as its last event
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = orjson.loads(events[-2])
    assert last["error"]["code"] == "migration_limit", events
    text = "".join(orjson.loads(e)["choices"][0]["text"] for e in events[:-2] if orjson.loads(e).get("choices"))
    assert text == "Half an answer"
    wait_until(lambda: not any(running(stack).values()), 20, "both workers to be idle")
