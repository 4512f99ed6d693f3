"""sse-starlette: ``StreamingEvents`` (app/api/sse.py) keeps sse-starlette's response (constructor,
headers, HEAD answer) and drives the stream itself. If the constructor's parameters or the headers it
sets changed, the stream would fail or lose what keeps proxies from buffering it; the behaviour of the
stream itself (bytes as they are, pings while idle, a client that leaves) is checked here through a
real Starlette app, and end to end in tests/e2e/test_cancellation.py and tests/chaos/test_queueing.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from app.api.sse import DONE, PING, StreamingEvents, sse_event
from tests.third_party.guard import drift, installed, parameters

LIBRARY = installed("sse-starlette")
WHERE = "app/api/sse.py (StreamingEvents)"


def test_the_constructor_takes_what_streaming_events_passes() -> None:
    params = parameters(EventSourceResponse.__init__)
    assert {"content", "ping", "sep", "send_timeout"} <= set(params), drift(
        LIBRARY, f"EventSourceResponse.__init__ takes {params}", WHERE, "StreamingEvents.__init__")


def _app(events: list[bytes], idle_s: float = 0, ping_s: float = 0) -> Starlette:
    async def stream() -> AsyncIterator[bytes]:
        for event in events:
            if idle_s:
                await asyncio.sleep(idle_s)
            yield event

    async def endpoint(request: Request) -> StreamingEvents:
        return StreamingEvents(stream(), ping_s=ping_s)

    return Starlette(routes=[Route("/events", endpoint, methods=["GET", "HEAD"])])


async def _get(app: Starlette, method: str = "GET") -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice") as client:
        return await client.request(method, "/events")


async def test_events_go_out_as_they_are_with_the_sse_headers() -> None:
    events = [sse_event(b'{"n": 1}'), sse_event(b'{"n": 2}'), DONE]
    response = await _get(_app(events))
    assert response.status_code == 200 and response.content == b"".join(events)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-store" and response.headers["x-accel-buffering"] == "no", drift(
        LIBRARY, f"EventSourceResponse no longer sets the SSE headers ({dict(response.headers)})", WHERE,
        "the headers EventSourceResponse.__init__ sets")


async def test_an_idle_stream_is_pinged() -> None:
    response = await _get(_app([sse_event(b"1"), DONE], idle_s=0.3, ping_s=0.1))
    body = response.content
    assert body.count(PING) >= 2 and body.replace(PING, b"") == sse_event(b"1") + DONE


async def test_head_gets_the_headers_and_no_stream() -> None:
    response = await _get(_app([sse_event(b"1"), DONE], idle_s=30), method="HEAD")
    assert response.status_code == 200 and response.content == b""


async def test_a_client_that_leaves_ends_the_stream_even_when_its_cancel_is_swallowed() -> None:
    """The events generator swallows the cancel (as Python 3.11's ``asyncio.wait_for`` does when its
    awaitable finished in the same loop turn): the response still stops at the next event, closes the
    generator (which cancels the request on its worker) and never sends the stream's end."""
    closed = asyncio.Event()
    client_left = asyncio.Event()
    sent: list[dict] = []

    async def stream() -> AsyncIterator[bytes]:
        try:
            for n in range(100):
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    pass
                yield sse_event(str(n).encode())
        finally:
            closed.set()

    async def receive() -> dict:
        await client_left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if len(sent) == 3:  # the headers and two events, then the client hangs up
            client_left.set()

    response = StreamingEvents(stream())
    await asyncio.wait_for(response({"type": "http", "method": "GET"}, receive, send), 10)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert closed.is_set() and 2 <= len(bodies) <= 3, bodies
    assert all(m["more_body"] for m in bodies), "the stream's end was sent to a client that left"
