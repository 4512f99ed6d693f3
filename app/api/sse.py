"""Server-Sent Events for the streaming endpoints: sse-starlette's response (its headers, and its
HEAD answer), driven by a leaner loop of its own.

sse-starlette runs every response in an anyio task group of four tasks (the stream, pings, the
server's exit signal, the client's disconnect): starting, cancelling and joining them cost about 9%
of the frontend's CPU at 32 concurrent streams (py-spy, docs/performance.md). Here the request's own
task streams, and ONE watcher task per response waits for the client's disconnect (then cancels the
stream, so the request is aborted on its worker at once) and sends a keep-alive comment when nothing
was sent for ``ping_s``. The server's shutdown is the frontend's own (app/shutdown.py). Events are
pre-encoded ``data: ...`` bytes, sent as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from sse_starlette import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class StreamingEvents(EventSourceResponse):
    """``ping_s``: a comment line (``: ping``) when nothing was sent for ``ping_s`` seconds, so a
    request waiting in a queue keeps its connection through proxies' idle timeouts (clients skip
    comments); 0: none."""

    def __init__(self, events: AsyncGenerator[bytes, None], ping_s: float = 0) -> None:
        super().__init__(events, ping=ping_s, sep="\n", send_timeout=None)
        self._events = events
        self._ping_s = ping_s
        self._last_sent = 0.0
        self._finished = False
        self._client_left = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() == "HEAD":
            await super().__call__(scope, receive, send)  # sse-starlette's own answer
            return
        loop = asyncio.get_running_loop()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._last_sent = loop.time()
        streamer = asyncio.current_task()
        assert streamer is not None
        watcher = loop.create_task(self._watch(receive, send, streamer), name="sse-watch")
        try:
            async for chunk in self._events:
                if self._client_left:  # its cancel was swallowed on the way (see _watch): end here
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self._last_sent = loop.time()
            else:
                self._finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._client_left:
                raise
            streamer.uncancel()  # the client left: the stream ends here, quietly
        finally:
            self._finished = True
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self._events.aclose()
        if self.background is not None:
            await self.background()

    async def _watch(self, receive: Receive, send: Send, streamer: asyncio.Task) -> None:
        """Until the client leaves (then cancel ``streamer``), send pings when the stream is idle.

        A cancel is delivered once, and code on the way may swallow it (Python 3.11's
        ``asyncio.wait_for`` returns the result when its awaitable finished in the same loop turn as
        the cancel): the streaming loop also stops at its next event once the client has left."""
        loop = asyncio.get_running_loop()
        while True:
            timeout = None if self._ping_s <= 0 else max(0.0, self._last_sent + self._ping_s - loop.time())
            try:
                async with asyncio.timeout(timeout):
                    message: Message = await receive()
            except TimeoutError:
                if not self._finished and loop.time() - self._last_sent >= self._ping_s:
                    self._last_sent = loop.time()
                    await send({"type": "http.response.body", "body": PING, "more_body": True})
                continue
            if message["type"] == "http.disconnect":
                self._client_left = True
                if not self._finished:
                    streamer.cancel()
                return
