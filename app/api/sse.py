"""Server-Sent Events for the streaming endpoints, on sse-starlette.

sse-starlette gives the response its client-disconnect listener (which cancels the generator,
so the request is aborted on the worker at once) and graceful shutdown. Two costs it would add
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
    def __init__(self, events: AsyncIterator[bytes]) -> None:
        super().__init__(events, ping=0, sep="\n", send_timeout=None)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)
