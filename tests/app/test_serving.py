"""The chat and completions endpoints on the shared serving path (app.api.serving), with a real model
card and a scripted generation: the order of the request checks, what reaches start_choices, and
the exact responses, streamed (which events, grouped into which writes) and whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from app.api import serving
from app.api.chat import chat_completions
from app.api.completions import completions
from app.model_card import ModelCard
from app.prompts.rendering import chat_prompt_ids
from app.protocol.chat import ChatCompletionRequest
from app.protocol.completions import CompletionRequest
from app.requests.choices import Choices
from core.errors import InvalidRequest, ModelNotFound, UpstreamError
from core.settings import Settings

USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
         "prompt_tokens_details": {"cached_tokens": 1, "transferred_tokens": 2}}


class ScriptedGeneration:
    """Stands in for app.requests.generation.Generation: yields ``pieces``, then finishes or raises ``error``."""

    def __init__(self, pieces: list[str], error: Exception | None = None) -> None:
        self.request_id = "r1"
        self.pieces = pieces
        self.error = error
        self.finish_reason: str | None = None
        self.prompt_tokens, self.completion_tokens, self.cached_tokens, self.transferred_tokens = 5, 3, 1, 2
        self.served_by = "w7"
        self.prefill_worker_id: str | None = None
        self.plan = None  # no prefill pool: no disaggregation decision
        self.closed = False
        self.prompt_logprobs = None

    async def __aenter__(self) -> ScriptedGeneration:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self.closed = True

    def take_logprobs(self) -> list:
        return []

    async def text(self) -> AsyncIterator[str]:
        for piece in self.pieces:
            yield piece
        if self.error is not None:
            raise self.error
        self.finish_reason = "length"


@pytest.fixture(scope="module")
def card(tokenizer_dir) -> ModelCard:  # noqa: ANN001
    return ModelCard.load("m", tokenizer_dir)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What start_choices was called with; it returns the generation the test put in ``gen``."""
    calls: list[dict[str, Any]] = []

    async def fake_start(rt, request, body, card, principal, prompt_ids, requested_max_tokens, logprobs=None,  # noqa: ANN001, ANN202
                         **_: object):
        calls.append({"prompt_ids": prompt_ids, "max_tokens": requested_max_tokens, "principal": principal})
        return Choices([rt.gen])

    monkeypatch.setattr(serving, "start_choices", fake_start)
    return calls


def runtime(card: ModelCard, gen: ScriptedGeneration, max_n: int = 1) -> SimpleNamespace:
    settings = Settings()
    settings.frontend.max_n = max_n

    async def lookup(model: str) -> ModelCard:
        if model != card.name:
            raise ModelNotFound(f"the model {model!r} does not exist", param="model")
        return card

    return SimpleNamespace(settings=settings, directory=SimpleNamespace(card=lookup, resolve=lambda m: (m, None)),
                           gen=gen)


REQUEST = SimpleNamespace(headers={})


def events(write: bytes) -> list[Any]:
    """The SSE events of one write, JSON-decoded (``[DONE]`` as the string)."""
    assert write.endswith(b"\n\n")
    out = []
    for event in write.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ")
        data = event[len(b"data: "):]
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


async def writes(response: Any) -> list[list[Any]]:
    return [events(w) async for w in response.body_iterator]


def chat_chunk(delta: dict[str, Any], finish: str | None = None, created: int = 0) -> dict[str, Any]:
    return {"id": "chatcmpl-r1", "created": created, "model": "m", "object": "chat.completion.chunk", "usage": None,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def text_chunk(text: str, finish: str | None = None, created: int = 0) -> dict[str, Any]:
    return {"id": "cmpl-r1", "created": created, "model": "m", "object": "text_completion", "usage": None,
            "system_fingerprint": None,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def same_time(written: list[list[Any]]) -> int:
    """Every chunk of a stream carries the same ``created``; returns it."""
    stamps = {e["created"] for w in written for e in w if isinstance(e, dict) and "created" in e}
    assert len(stamps) == 1
    return stamps.pop()


async def test_chat_whole_response(card: ModelCard, started: list[dict[str, Any]]) -> None:
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=7)
    gen = ScriptedGeneration(["Hel", "lo"])
    response = await chat_completions(body, REQUEST, runtime(card, gen), None)
    assert started == [{"prompt_ids": await chat_prompt_ids(card, body), "max_tokens": 7, "principal": None}]
    payload = json.loads(response.body)
    assert payload == {"id": "chatcmpl-r1", "created": payload["created"], "model": "m", "object": "chat.completion",
                       "system_fingerprint": None, "usage": USAGE,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                    "finish_reason": "length", "logprobs": None}]}
    assert response.media_type == "application/json" and response.headers["x-sluice-worker"] == "w7"
    assert gen.closed


async def test_chat_stream_opens_with_the_role_and_ends_with_finish_usage_and_done_in_one_write(
        card: ModelCard, started: list[dict[str, Any]]) -> None:
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                 stream_options={"include_usage": True})
    gen = ScriptedGeneration(["Hel", "lo"])
    response = await chat_completions(body, REQUEST, runtime(card, gen), None)
    assert response.headers["x-sluice-worker"] == "w7"
    written = await writes(response)
    t = same_time(written)
    usage = {**chat_chunk({}, created=t), "choices": [], "usage": USAGE}
    assert written == [
        [chat_chunk({"role": "assistant", "content": ""}, created=t), chat_chunk({"content": "Hel"}, created=t)],
        [chat_chunk({"content": "lo"}, created=t)],
        [chat_chunk({}, "length", created=t), usage, "[DONE]"],
    ]
    assert gen.closed


async def test_a_failure_ends_the_stream_with_an_error_event_and_done(card: ModelCard,
                                                                       started: list[dict[str, Any]]) -> None:
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    gen = ScriptedGeneration([], error=UpstreamError("the worker failed: boom", code="engine_error"))
    written = await writes(await chat_completions(body, REQUEST, runtime(card, gen), None))
    t = same_time(written)
    error = {"error": {"message": "the worker failed: boom", "type": "server_error", "param": None,
                       "code": "engine_error"}}
    assert written == [[chat_chunk({"role": "assistant", "content": ""}, created=t), error, "[DONE]"]]


async def test_completion_whole_response_with_the_prompt_echoed(card: ModelCard, started: list[dict[str, Any]]) -> None:
    body = CompletionRequest(model="m", prompt="Once upon", echo=True, max_tokens=4)
    gen = ScriptedGeneration([" a", " time"])
    payload = json.loads((await completions(body, REQUEST, runtime(card, gen), None)).body)
    assert started[0]["prompt_ids"] == card.encode("Once upon", add_special_tokens=True)
    assert started[0]["max_tokens"] == 4
    assert payload == {**text_chunk("Once upon a time", "length", created=payload["created"]), "id": "cmpl-r1",
                       "usage": USAGE}


async def test_completion_stream_sends_the_echo_with_the_first_text(card: ModelCard,
                                                                   started: list[dict[str, Any]]) -> None:
    ids = card.encode("Once upon", add_special_tokens=False)
    body = CompletionRequest(model="m", prompt=ids, echo=True, stream=True)  # token ids: echoed decoded
    gen = ScriptedGeneration([" a", " time"])
    written = await writes(await completions(body, REQUEST, runtime(card, gen), None))
    t = same_time(written)
    assert started[0]["prompt_ids"] == ids
    assert written == [
        [text_chunk(card.decode(ids), created=t), text_chunk(" a", created=t)],
        [text_chunk(" time", created=t)],
        [text_chunk("", "length", created=t), "[DONE]"],
    ]


async def test_completion_stream_without_echo_has_no_opening(card: ModelCard, started: list[dict[str, Any]]) -> None:
    body = CompletionRequest(model="m", prompt="Once upon", stream=True, stream_options={"include_usage": True})
    written = await writes(await completions(body, REQUEST, runtime(card, ScriptedGeneration([])), None))
    t = same_time(written)
    usage = {**text_chunk("", created=t), "choices": [], "usage": USAGE}
    assert written == [[text_chunk("", "length", created=t), usage, "[DONE]"]]


async def test_request_checks_come_in_order_before_the_model_is_looked_up(card: ModelCard,
                                                                          started: list[dict[str, Any]]) -> None:
    gen = ScriptedGeneration([])
    two_prompts = CompletionRequest(model="nope", prompt=["a", "b"], n=2)
    with pytest.raises(InvalidRequest) as first:
        await completions(two_prompts, REQUEST, runtime(card, gen), None)
    assert first.value.param == "n"  # the frontend's limits first
    with pytest.raises(InvalidRequest) as second:
        await completions(two_prompts, REQUEST, runtime(card, gen, max_n=2), None)
    assert second.value.param == "prompt"  # then the endpoint's own checks, before the (unknown) model
    with pytest.raises(ModelNotFound):
        await completions(CompletionRequest(model="nope", prompt="a"), REQUEST, runtime(card, gen), None)
    chat = ChatCompletionRequest(model="nope", messages=[{"role": "user", "content": "hi"}], n=3)
    with pytest.raises(InvalidRequest, match="n must be at most 1"):
        await chat_completions(chat, REQUEST, runtime(card, gen), None)
    assert started == []

