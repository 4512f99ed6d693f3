"""The frontend's limit on request bodies (``SLUICE_FRONTEND__MAX_BODY_BYTES``), as ASGI middleware.

A body whose ``Content-Length`` is over the limit is answered 413 before any of it is read; a body
without one (chunked) is counted as it is read, and reading stops at the first chunk past the
limit, so the frontend never holds more than the limit plus one chunk. Either way the answer is
OpenAI's error body with ``code: request_too_large``. The server discards the unread rest of the
body, so a keep-alive connection serves the client's next request.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.http_errors import http_exception_response


class BodyTooLarge(HTTPException):
    """The 413. Raised from ``receive`` when a body being read passes the limit: an HTTP exception
    because FastAPI lets those out of its body parsing unchanged (it turns others into a 400), and
    the error handlers render it (core.http_errors: ``code: request_too_large``)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, detail=f"the request body is larger than the limit of {max_bytes} bytes")


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``, None when absent or not a number (the server rejects those)."""
    value = Headers(scope=scope).get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class BodySizeLimit:
    """ASGI middleware: bodies of at most ``max_bytes`` reach the app; larger ones get 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await http_exception_response(BodyTooLarge(self.max_bytes))(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, receive_within_limit, send)
