"""The last resort for a bug: an exception no handler knows becomes an OpenAI-shaped 500, and the
connection stays open.

Starlette hands an ``Exception`` handler to its outermost middleware, which sends the response and
then raises the exception again to the server; uvicorn then closes the connection, so the client's
next request on that keep-alive connection fails too. This middleware sits inside it, answers the
500 itself and returns normally. A stream that already started cannot be answered: there the
exception goes on (the stream is cut, as it must be).
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.http_errors import error_response

log = logging.getLogger(__name__)


class UnexpectedErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started:
                raise
            log.exception("unhandled error on %s", scope.get("path"))
            await error_response(500, "internal error", "internal_error")(scope, receive, send)
