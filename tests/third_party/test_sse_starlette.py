"""sse-starlette: ``StreamingEvents`` (app/api/sse.py) overrides the private
``EventSourceResponse._send_with_timeout`` so that an event is sent without a timeout scope when no
send timeout is set. If sse-starlette stopped calling it for every event, the override would be
silently skipped; if it changed its signature, every stream would fail."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from sse_starlette.sse import EventSourceResponse, SendTimeoutError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message

from app.api.sse import DONE, StreamingEvents, sse_event
from tests.third_party.guard import drift, installed, parameters

LIBRARY = installed("sse-starlette")
WHERE = "app/api/sse.py (StreamingEvents._send_with_timeout)"


def test_send_with_timeout_keeps_its_signature() -> None:
    method = EventSourceResponse._send_with_timeout
    assert inspect.iscoroutinefunction(method), drift(
        LIBRARY, "EventSourceResponse._send_with_timeout is no longer a coroutine function", WHERE,
        "how EventSourceResponse sends each event")
    assert parameters(method) == ["self", "send", "message"], drift(
        LIBRARY, f"EventSourceResponse._send_with_timeout{inspect.signature(method)} changed its signature", WHERE,
        "the override's parameters")


async def test_every_event_is_sent_through_the_override_and_passed_through_as_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events = [sse_event(b'{"n": 1}'), sse_event(b'{"n": 2}'), DONE]
    through_override: list[Message] = []
    override = StreamingEvents._send_with_timeout

    async def spy(self: StreamingEvents, send, message: Message) -> None:  # type: ignore[no-untyped-def]
        through_override.append(message)
        await override(self, send, message)

    monkeypatch.setattr(StreamingEvents, "_send_with_timeout", spy)

    async def stream() -> AsyncIterator[bytes]:
        for event in events:
            yield event

    async def endpoint(request: Request) -> StreamingEvents:
        return StreamingEvents(stream())

    app = Starlette(routes=[Route("/events", endpoint)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice") as client:
        response = await client.get("/events")
    assert response.status_code == 200
    assert response.content == b"".join(events), drift(
        LIBRARY, "pre-encoded bytes events are no longer written as they are", "app/api/sse.py (sse_event, DONE)",
        "how EventSourceResponse encodes bytes (ensure_bytes)")
    bodies = [m["body"] for m in through_override if m["type"] == "http.response.body" and m["body"]]
    assert bodies == events, drift(
        LIBRARY, "events are no longer sent through EventSourceResponse._send_with_timeout", WHERE,
        "which method _stream_response sends events with")


async def test_the_override_sends_plainly_and_the_base_still_enforces_a_timeout() -> None:
    async def nothing() -> AsyncIterator[bytes]:
        return
        yield b""

    response = StreamingEvents(nothing())
    assert response.send_timeout is None
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    message: Message = {"type": "http.response.body", "body": b"data: x\n\n", "more_body": True}
    await response._send_with_timeout(send, message)
    assert sent == [message]

    # With a timeout set, the override defers to sse-starlette's own method, which must still time out.
    response.send_timeout = 0.01

    async def stuck(message: Message) -> None:
        await anyio.sleep(5)

    try:
        await response._send_with_timeout(stuck, message)
    except SendTimeoutError:
        return
    pytest.fail(drift(LIBRARY, "EventSourceResponse._send_with_timeout no longer raises SendTimeoutError when "
                      "a send outlasts send_timeout", WHERE, "what the base method does with send_timeout"))
