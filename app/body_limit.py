"""A bound on request body size, enforced before anything parses the body.

A body whose ``Content-Length`` exceeds ``max_bytes`` is answered 413 at once, unread; a chunked
body is counted as it arrives and refused at the chunk that crosses the bound (nothing buffers
more than the bound). The error is OpenAI-shaped (``code: request_too_large``).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.http_errors import error_body


def _too_large(max_bytes: int) -> str:
    return f"the request body is larger than {max_bytes} bytes"


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.max_bytes <= 0:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": error_body(
                _too_large(self.max_bytes), "invalid_request_error", None, "request_too_large")})
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # the handlers answer it (core.http_errors)
                    raise HTTPException(413, _too_large(self.max_bytes))
            return message

        await self.app(scope, counted, send)
