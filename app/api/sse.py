"""Server-Sent Events for the streaming endpoints, on sse-starlette.

sse-starlette gives the response its client-disconnect listener (which cancels the generator,
so the request is aborted on the worker at once) and keep-alive pings; shutdown is the frontend's
own (app/shutdown.py). Two costs it would add
per event are avoided here: events are pre-encoded ``data: ...`` bytes (passed through as they
are), and sends are not wrapped in a timeout scope when no send timeout is set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse
from starlette.types import Message, Send

DONE = b"data: [DONE]\n\n"


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class StreamingEvents(EventSourceResponse):
    """``ping_s``: a comment line (``: ping ...``) every ``ping_s`` seconds, so a request waiting in a
    queue keeps its connection through proxies' idle timeouts (clients skip comments); 0: none."""

    def __init__(self, events: AsyncIterator[bytes], ping_s: float = 0) -> None:
        super().__init__(events, ping=ping_s, sep="\n", send_timeout=None)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)
